"""workload.py — the CPU-bound Python workload of bench/agent_bench.sh.

Run natively and under `sptrace run` by /usr/bin/python3.11; the two outputs
must be identical.  Recursion (many small interpreter calls), dict and
string work, list sorting and a small class hierarchy: about 1-3 s natively
on the benchmark machine.  SCALE (first argument, default 1) multiplies the
work of every part.
"""
import sys


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def dict_work(n):
    d = {}
    for i in range(n):
        k = "k%d" % (i % 5003)
        d[k] = d.get(k, 0) + i
    return sum(d.values()) % 1000000007


def list_work(n):
    a = [(i * 7919) % 100003 for i in range(n)]
    a.sort()
    b = sorted(a, key=lambda x: -x)
    return (sum(a[::97]) + len(set(b)) + b[0]) % 1000000007


class Shape:
    def area(self):
        return 0


class Rect(Shape):
    def __init__(self, w, h):
        self.w, self.h = w, h

    def area(self):
        return self.w * self.h


class Square(Rect):
    def __init__(self, s):
        super().__init__(s, s)


def object_work(n):
    total = 0
    for i in range(n):
        s = Square(i % 17) if i % 2 else Rect(i % 13, i % 7)
        total += s.area()
    return total


def main():
    scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("fib", sum(fib(25) for _ in range(scale)))
    print("dict", dict_work(1000000 * scale))
    print("list", list_work(1000000 * scale))
    print("objects", object_work(1000000 * scale))


main()

// traced_cxx.cpp — the C++ program the demangling tests describe.  Like
// traced.c it is never run: the tests analyse it for the addresses of its
// functions and call sites.  Its callees have the names demangling must
// handle: namespaces, a class template, operators, a destructor, a function
// template, a lambda, an anonymous namespace, extern "C", an indirect call
// inside a C++ function and a PLT call into the C++ runtime (operator new).
#define NOIPA __attribute__((noipa))

namespace ns {

template <typename T> struct Box {
	T v;
	NOIPA T get(int k) const { return v + k; }
};

struct Vec {
	int x;
	NOIPA Vec &operator+=(const Vec &o) { x += o.x; return *this; }
	NOIPA bool operator<(const Vec &o) const { return x < o.x; }
	NOIPA int operator()(int k) const { return x * k; }
	NOIPA ~Vec() { x = 0; }
};

template <typename T> NOIPA T biggest(T a, T b) { return a < b ? b : a; }

NOIPA int apply(int (*f)(int), int x) { return f(x); }

} // namespace ns

namespace {
NOIPA int helper(int x) { return x + 2; }
} // namespace

extern "C" NOIPA int plain_c(int x) { return x - 1; }

int main(int argc, char **)
{
	ns::Box<long> b{argc};
	ns::Vec v{argc}, w{2};
	auto twice = [](int k) { return 2 * k; };
	int r = (int)b.get(1);

	v += w;
	r += v < w;
	r += v(3);
	r += (int)ns::biggest<long>(r, 4);
	r += twice(r);
	r += helper(r);
	r += plain_c(r);
	r += ns::apply(helper, r);
	int *p = new int(r);
	r += *p;
	delete p;
	return r;
}

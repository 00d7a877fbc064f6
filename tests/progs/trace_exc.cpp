// trace_exc.cpp — a C++ exception thrown through five traced frames, with a
// destructor in each, caught at the top.  Output and exit status must be the
// same with and without tracing.
#include <cstdio>
#include <stdexcept>
#include <string>

#define KEEP __attribute__((noinline, noclone))

struct Guard {
	const char *name;
	~Guard() { std::printf("~%s\n", name); }
};

KEEP void f5(int x) { Guard g{"f5"}; if (x > 0) throw std::runtime_error("deep " + std::to_string(x)); }
KEEP void f4(int x) { Guard g{"f4"}; f5(x); }
KEEP void f3(int x) { Guard g{"f3"}; f4(x); }
KEEP void f2(int x) { Guard g{"f2"}; f3(x); }
KEEP void f1(int x) { Guard g{"f1"}; f2(x); }

KEEP int catcher(int x)
{
	try {
		f1(x);
	} catch (const std::exception &e) {
		std::printf("caught: %s\n", e.what());
		return 4;
	}
	return 0;
}

int main(int argc, char **) { return catcher(argc) + catcher(argc - 1); }

// exceptions.cpp — C++ for the e2e tests of `sptrace analyze-binary`
// (tests/e2e/test_cxx.py): classes with virtual calls, std::string and
// std::vector, and an exception thrown through five frames that each hold
// an object with a destructor, so the binary has landing pads, cleanup code
// that calls destructors, and catch handlers.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define NOINLINE __attribute__((noinline))

namespace {

int g_destroyed;

// A destructor with a visible side effect, so every frame needs cleanup code.
struct Guard {
	std::string name;
	explicit Guard(std::string n) : name(std::move(n)) {}
	~Guard() { g_destroyed += static_cast<int>(name.size()); }
};

class Shape {
public:
	virtual ~Shape() = default;
	virtual double area() const = 0;
	virtual std::string label() const { return "shape"; }
};

class Rect : public Shape {
public:
	Rect(double w, double h) : w_(w), h_(h) {}
	double area() const override { return w_ * h_; }
	std::string label() const override { return "rect " + std::to_string(w_); }

private:
	double w_, h_;
};

class Circle : public Shape {
public:
	explicit Circle(double r) : r_(r) {}
	double area() const override
	{
		if (r_ < 0)
			throw std::domain_error("negative radius");
		return 3.14159 * r_ * r_;
	}

private:
	double r_;
};

class ParseError : public std::runtime_error {
public:
	ParseError(const std::string &what, int depth) : std::runtime_error(what), depth_(depth) {}
	int depth() const { return depth_; }

private:
	int depth_;
};

NOINLINE int frame5(int x)
{
	Guard g("frame5");
	std::vector<int> v(static_cast<size_t>(x % 7 + 1), x);
	if (x > 3)
		throw ParseError("too deep at " + std::to_string(x), 5);
	return static_cast<int>(v.size());
}

NOINLINE int frame4(int x)
{
	Guard g("frame4");
	std::string s(static_cast<size_t>(x + 1), 'q');
	return frame5(x + 1) + static_cast<int>(s.size());
}

NOINLINE int frame3(int x)
{
	Guard g("frame3");
	std::vector<std::string> words{ "a", "bb", "ccc" };
	return frame4(x + 1) + static_cast<int>(words.size());
}

NOINLINE int frame2(int x)
{
	Guard g("frame2");
	auto owned = std::make_unique<Rect>(x, x + 1);
	return frame3(x) + static_cast<int>(owned->area());
}

NOINLINE int frame1(int x)
{
	Guard g("frame1");
	try {
		return frame2(x);
	} catch (const ParseError &e) {
		std::printf("caught '%s' from depth %d\n", e.what(), e.depth());
		return -e.depth();
	}
}

NOINLINE double total_area(const std::vector<std::unique_ptr<Shape>> &shapes)
{
	double sum = 0;
	for (const auto &s : shapes) {
		try {
			sum += s->area(); // virtual call
		} catch (const std::domain_error &e) {
			std::printf("skipped %s: %s\n", s->label().c_str(), e.what());
		}
	}
	return sum;
}

} // namespace

int main(int argc, char **argv)
{
	std::vector<std::unique_ptr<Shape>> shapes;
	shapes.push_back(std::make_unique<Rect>(2, 3));
	shapes.push_back(std::make_unique<Circle>(argc));
	shapes.push_back(std::make_unique<Circle>(-argc));

	int r = frame1(argc) + frame1(argc + 5);
	double a = total_area(shapes);
	std::printf("%d %.1f %d %s\n", r, a, g_destroyed, shapes[0]->label().c_str());
	return argv[0] ? 0 : 1;
}

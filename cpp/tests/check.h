// A minimal test harness for the C++ core (no third-party test framework needed to build it).
// TEST(name) { CHECK(...); CHECK_EQ(a, b); }  and  int main() { return pagedcore_test::run_all(); }
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace pagedcore_test {

struct TestCase {
  const char* name;
  std::function<void()> fn;
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
std::string show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
template <typename T>
std::string show(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// PAGEDCORE_TEST_SKIP=name,name: tests not to run here, each reported as skipped (the emulated-CPU
// runs of cpp/tests/run_emulated_cpus.sh skip one whose fork() the emulator itself cannot take).
inline bool skipped(const char* name) {
  const char* list = std::getenv("PAGEDCORE_TEST_SKIP");
  if (!list) return false;
  const std::string all = std::string(",") + list + ",";
  return all.find(std::string(",") + name + ",") != std::string::npos;
}

inline int run_all() {
  int failed = 0, skips = 0;
  for (const TestCase& t : registry()) {
    if (skipped(t.name)) {
      ++skips;
      std::printf("[SKIP] %s (PAGEDCORE_TEST_SKIP)\n", t.name);
      continue;
    }
    try {
      t.fn();
      std::printf("[ OK ] %s\n", t.name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[FAIL] %s: %s\n", t.name, e.what());
    }
  }
  std::printf("%d/%zu passed", static_cast<int>(registry().size()) - failed - skips, registry().size());
  if (skips) std::printf(", %d skipped", skips);
  std::printf("\n");
  return failed == 0 ? 0 : 1;
}

}  // namespace pagedcore_test

#define PC_CONCAT2(a, b) a##b
#define PC_CONCAT(a, b) PC_CONCAT2(a, b)
#define TEST(name)                                                                     \
  static void name();                                                                  \
  static pagedcore_test::Registrar PC_CONCAT(registrar_, name)(#name, name);           \
  static void name()

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond))                                                                       \
      throw pagedcore_test::Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                    ": CHECK(" #cond ") failed");                      \
  } while (0)

#define CHECK_EQ(a, b)                                                                 \
  do {                                                                                 \
    const auto& pc_a = (a);                                                            \
    const auto& pc_b = (b);                                                            \
    if (!(pc_a == pc_b))                                                               \
      throw pagedcore_test::Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                    ": " #a " == " #b " failed: " +                    \
                                    pagedcore_test::show(pc_a) + " vs " + pagedcore_test::show(pc_b)); \
  } while (0)

#define CHECK_THROWS(expr)                                                             \
  do {                                                                                 \
    bool pc_threw = false;                                                             \
    try {                                                                              \
      (void)(expr);                                                                    \
    } catch (const std::exception&) {                                                  \
      pc_threw = true;                                                                 \
    }                                                                                  \
    if (!pc_threw)                                                                     \
      throw pagedcore_test::Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                    ": " #expr " did not throw");                      \
  } while (0)

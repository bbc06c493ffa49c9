// The C++ unit tests' checks: CHECK(cond) and CHECK_THROWS(expr, type, text) report the failing line and go
// on; main returns Failures() (0: every check passed).
#pragma once

#include <cstdio>
#include <string>

namespace infinitrain::testing {

inline int& FailureCount() {
    static int n = 0;
    return n;
}

inline int Failures() {
    if (FailureCount() == 0) std::printf("all checks passed\n");
    return FailureCount() == 0 ? 0 : 1;
}

inline void Fail(const char* file, int line, const std::string& what) {
    std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what.c_str());
    FailureCount() += 1;
}

}  // namespace infinitrain::testing

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) ::infinitrain::testing::Fail(__FILE__, __LINE__, #cond); \
    } while (0)

// expr must raise `type` whose what() contains `text`.
#define CHECK_THROWS(expr, type, text)                                                                               \
    do {                                                                                                             \
        try {                                                                                                        \
            (void)(expr);                                                                                            \
            ::infinitrain::testing::Fail(__FILE__, __LINE__, #expr " did not raise " #type);                         \
        } catch (const type& e) {                                                                                    \
            if (std::string(e.what()).find(text) == std::string::npos) {                                             \
                ::infinitrain::testing::Fail(__FILE__, __LINE__,                                                     \
                                             #expr " raised '" + std::string(e.what()) + "', not '" + (text) + "'"); \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

// consumer.cpp — the same program as consumer.c, compiled as C++: the
// public headers must be valid C++ (extern "C", no C-only constructs).
#include "consumer.c"

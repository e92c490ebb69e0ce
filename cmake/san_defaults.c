/*
 * san_defaults.c — the sanitizer options every program of a sanitizer build
 * runs with, built in (the runtimes call these functions at start) rather
 * than left to the Makefile's environment, so `ctest` alone passes in any
 * sanitizer build: an impossible allocation comes back as NULL (the
 * library reports MLO_ENOMEM, as libc does; ASan would abort), leaks and
 * undefined behaviour fail the program.  ASAN_OPTIONS and friends in the
 * environment still win, option by option (the multi-rank tests turn the
 * leak check off that way).  CMake adds this file to every executable of
 * an MLO_SANITIZE or MLO_TSAN build (mlo_sanitizer_defaults).
 */
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);
const char *__tsan_default_options(void);

__attribute__((visibility("default"), used)) const char *__asan_default_options(void) {
  return "detect_leaks=1:abort_on_error=1:strict_string_checks=1:"
         "detect_stack_use_after_return=1:allocator_may_return_null=1";
}

__attribute__((visibility("default"), used)) const char *__ubsan_default_options(void) {
  return "halt_on_error=1:print_stacktrace=1";
}

__attribute__((visibility("default"), used)) const char *__tsan_default_options(void) {
  return "halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1";
}

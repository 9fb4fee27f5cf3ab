// A shared library opened at run time: how libte uses cuBLASLt and NCCL without linking them, so
// that libte.so loads on machines that lack them and says why when a feature needs them.
#pragma once

#include <initializer_list>

namespace te {

class DynamicLibrary {
 public:
  // Opens the first of `names` that loads (the versioned name first). Throws Unsupported:
  // "<what> could not be loaded (<needed_for>): <each loader error>".
  DynamicLibrary(std::initializer_list<const char *> names, const char *what, const char *needed_for);
  ~DynamicLibrary();
  DynamicLibrary(const DynamicLibrary &) = delete;
  DynamicLibrary &operator=(const DynamicLibrary &) = delete;

  // *out = the symbol `name`, typed as the function it is. A missing required symbol throws
  // Unsupported naming it; a missing optional one leaves *out untouched.
  template <class Fn>
  void bind(const char *name, Fn *out, bool required = true) const {
    if (void *sym = symbol(name, required)) *out = reinterpret_cast<Fn>(sym);
  }

 private:
  void *symbol(const char *name, bool required) const;
  void *handle_ = nullptr;
  const char *what_;
};

}  // namespace te

#include "base/dynamic_library.h"

#include <dlfcn.h>

#include <string>

#include "base/check.h"

namespace te {

DynamicLibrary::DynamicLibrary(std::initializer_list<const char *> names, const char *what, const char *needed_for)
    : what_(what) {
  std::string errors;
  for (const char *name : names) {
    handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle_) return;
    const char *err = dlerror();
    errors += errors.empty() ? "" : "; ";
    errors += err ? err : name;
  }
  fail(Status::Unsupported, "%s could not be loaded (%s): %s", what, needed_for, errors.c_str());
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_) dlclose(handle_);
}

void *DynamicLibrary::symbol(const char *name, bool required) const {
  dlerror();
  void *sym = dlsym(handle_, name);
  if (!sym && required) {
    const char *err = dlerror();
    fail(Status::Unsupported, "%s: symbol %s not found in the loaded library (%s)", what_, name,
         err ? err : "no error text");
  }
  return sym;
}

}  // namespace te

// Messages that name one element of an array argument ("args->weights[3]") without formatting
// the name on the success path: the check runs with the array's name, and only when it fails is
// it run again with the element's, so that the error it throws names the element.
#pragma once

#include <cstdio>

#include "base/types.h"

namespace te {

// check(name) validates element i, throwing te::Error naming `name` when it is bad.
template <class Check>
auto at_element(const char *array, int i, Check &&check) -> decltype(check(array)) {
  try {
    return check(array);
  } catch (const Error &) {
    char name[96];
    std::snprintf(name, sizeof name, "%s[%d]", array, i);
    return check(name);
  }
}

}  // namespace te

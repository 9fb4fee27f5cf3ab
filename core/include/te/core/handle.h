// Every object the C API hands out derives from Handle first, so a handle of the wrong type is
// recognised by its tag (no virtual functions in handle classes: the tag sits at offset 0).
#pragma once

#include <cstdint>

namespace te {

enum class HandleKind : uint32_t {
  Dead = 0,
  Context = 0x54454358u,      // "TECX"
  Recipe = 0x54455243u,       // "TERC"
  Group = 0x54454752u,        // "TEGR"
  Linear = 0x54454c4eu,       // "TELN"
  BackwardCtx = 0x54454243u,  // "TEBC"
};

struct Handle {
  explicit Handle(HandleKind k) : handle_kind(k) {}
  ~Handle() { handle_kind = HandleKind::Dead; }
  Handle(const Handle &) = delete;
  Handle &operator=(const Handle &) = delete;
  HandleKind handle_kind;
};

}  // namespace te

// fuzz_api_sequence's state save/load operations (api_program.h): round trips, small buffers,
// mutated, truncated and extended states, loads into another layer.
#pragma once

#include "api_program.h"

namespace fuzz {

// ---- state save/load ----

inline void Program::state_ops() {
  bool mf = false;
  int ls;
  te_linear *lh = lin_arg(mf, ls);
  const int lctx = ls >= 0 && lin_[ls].h ? lin_[ls].ctx : 0;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, lctx);
  if (cs != lctx) mf = true;
  size_t need = 0x5EB7;
  te_status s = TE_CALL(te_linear_state_save, ctx, lh, nullptr, 0, &need);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_state_save accepted a bad handle");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(need == 0x5EB7, "te_linear_state_save failed but wrote *size");
    // The load must fail as well.
    uint8_t junk[64] = {'T', 'E', 'L', 'S', 1};
    FUZZ_ASSERT(TE_CALL(te_linear_state_load, ctx, lh, junk, sizeof junk) != TE_SUCCESS,
                "te_linear_state_load accepted a bad handle");
    return;
  }
  FUZZ_ASSERT(need > 0 && need < (1u << 22), "te_linear_state_save: implausible size %zu", need);
  Blob saved(need);
  size_t got = 0;
  FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, lh, saved.data(), need, &got) == TE_SUCCESS && got == need,
              "te_linear_state_save into %zu bytes failed", need);
  const std::vector<uint8_t> original = saved.snapshot();
  const uint32_t mode = R.pick(8);
  switch (mode) {
    case 0: {  // round trip (INVALID_STATE while an open scope or pending backward holds the states)
      const te_status ls0 = TE_CALL(te_linear_state_load, ctx, lh, saved.data(), need);
      FUZZ_ASSERT(ls0 == TE_SUCCESS || ls0 == TE_ERROR_INVALID_STATE,
                  "te_linear_state_load rejected what te_linear_state_save wrote (%s)", te_status_string(ls0));
      FUZZ_ASSERT(layer_state(ctx, lh) == original, "state save/load/save is not bit-exact");
      break;
    }
    case 1: {  // too small a buffer
      Blob small(need - 1);
      std::memset(small.data(), 0x61, small.size());
      const std::vector<uint8_t> sb = small.snapshot();
      size_t sz = 0x5EB7;
      FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, lh, small.data(), need - 1, &sz) != TE_SUCCESS,
                  "te_linear_state_save accepted capacity %zu < %zu", need - 1, need);
      FUZZ_ASSERT(sz == 0x5EB7 && small.equals(sb), "te_linear_state_save failed but wrote its outputs");
      break;
    }
    case 2: case 3: {  // mutated bytes
      std::vector<uint8_t> m = original;
      const int k = 1 + static_cast<int>(R.pick(4));
      for (int i = 0; i < k; ++i) m[R.pick(static_cast<uint32_t>(m.size()))] = R.u8();
      if (R.u8() >= 128) {  // a float field set to a special value
        static const uint32_t kSpecial[6] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0, 0x80000000u, 1};
        const uint32_t bits = kSpecial[R.pick(6)];
        const size_t at = 4 * R.pick(static_cast<uint32_t>(m.size() / 4));
        std::memcpy(&m[at], &bits, 4);
      }
      load_and_check(ctx, lh, m, original);
      break;
    }
    case 4: {  // truncated
      const size_t n = R.pick(static_cast<uint32_t>(need));
      Blob t(n);
      if (n) std::memcpy(t.data(), original.data(), n);
      FUZZ_ASSERT(TE_CALL(te_linear_state_load, ctx, lh, t.data(), n) != TE_SUCCESS,
                  "te_linear_state_load accepted a state truncated to %zu of %zu bytes", n, need);
      FUZZ_ASSERT(layer_state(ctx, lh) == original, "a failed te_linear_state_load changed the layer's state");
      break;
    }
    case 5: {  // trailing bytes
      std::vector<uint8_t> m = original;
      const size_t extra = 1 + R.pick(16);
      for (size_t i = 0; i < extra; ++i) m.push_back(R.u8());
      load_and_check(ctx, lh, m, original);
      break;
    }
    case 6: {  // into another layer (maybe of another shape, maybe of another context)
      const int other = static_cast<int>(R.pick(kLinearSlots));
      const LinSlot &O = lin_[other];
      if (!O.live || !ctx_live(O.ctx)) break;
      const std::vector<uint8_t> before = layer_state(ctx_of(O.ctx), O.h);
      te_status ls2 = TE_CALL(te_linear_state_load, ctx_of(O.ctx), O.h, saved.data(), need);
      if (ls >= 0 && (O.cfg.in != lin_[ls].cfg.in || O.cfg.out != lin_[ls].cfg.out))
        FUZZ_ASSERT(ls2 != TE_SUCCESS, "te_linear_state_load accepted the state of a layer of another shape");
      if (ls2 == TE_SUCCESS)
        FUZZ_ASSERT(layer_state(ctx_of(O.ctx), O.h) == original, "state loaded into another layer does not save back");
      else
        FUZZ_ASSERT(layer_state(ctx_of(O.ctx), O.h) == before, "a failed te_linear_state_load changed the layer's state");
      break;
    }
    default: {  // NULL or empty buffers
      const bool null_buf = R.u8() >= 128;
      FUZZ_ASSERT(TE_CALL(te_linear_state_load, ctx, lh, null_buf ? nullptr : saved.data(), null_buf ? need : 0) != TE_SUCCESS,
                  "te_linear_state_load accepted a NULL or empty buffer");
      size_t sz = 1;
      FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, lh, saved.data(), need, nullptr) != TE_SUCCESS,
                  "te_linear_state_save accepted size == NULL");
      (void)sz;
      break;
    }
  }
}

// Loads `m`: a success must save back bit for bit; a failure must change nothing.
inline void Program::load_and_check(te_context *ctx, te_linear *lh, const std::vector<uint8_t> &m, const std::vector<uint8_t> &original) {
  Blob buf(m.size());
  std::memcpy(buf.data(), m.data(), m.size());
  te_status s = TE_CALL(te_linear_state_load, ctx, lh, buf.data(), buf.size());
  FUZZ_ASSERT(buf.equals(m), "te_linear_state_load wrote into its input");
  if (s == TE_SUCCESS) {
    const std::vector<uint8_t> back = layer_state(ctx, lh);
    size_t at = 0;
    while (at < m.size() && at < back.size() && back[at] == m[at]) ++at;
    FUZZ_ASSERT(back == m,
                "a state te_linear_state_load accepted does not save back bit for bit (%zu vs %zu bytes; first "
                "difference at byte %zu)", back.size(), m.size(), at);
  }
  else
    FUZZ_ASSERT(layer_state(ctx, lh) == original, "a failed te_linear_state_load changed the layer's state");
}

inline void Program::scaling_state() {
  bool mf = false;
  int ls;
  te_linear *lh = lin_arg(mf, ls);
  const int lctx = ls >= 0 && lin_[ls].h ? lin_[ls].ctx : 0;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, lctx);
  if (cs != lctx) mf = true;
  static const int kRoles[5] = {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT, 3, -1};
  const int role = kRoles[R.pick(5)];
  mf |= role > 2 || role < 0;
  te_tensor_role r;
  set_enum(r, role);
  static const size_t kCaps[6] = {0, 1, 16, 1024, 2048, 3};
  const size_t cap = kCaps[R.pick(6)];
  const bool null_hist = R.u8() >= 200;
  Blob hist(cap * sizeof(float));
  std::memset(hist.data(), 0x7B, hist.size());
  te_scaling_state_info info;
  std::memset(&info, 0x7C, sizeof info);
  info.struct_size = sizeof info;
  const uint8_t v = R.u8();
  if (v >= 250) { info.struct_size = sizeof info - 4; mf = true; }
  const bool null_info = v >= 246 && v < 250;
  mf |= null_info;
  const std::vector<uint8_t> ib = bytes_of(&info, sizeof info), hb = hist.snapshot();
  te_status s = TE_CALL(te_linear_get_scaling_state, ctx, lh, r, null_info ? nullptr : &info,
                        null_hist ? nullptr : hist.floats(), cap);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_get_scaling_state accepted what it must reject");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(same_bytes(&info, ib) && hist.equals(hb), "te_linear_get_scaling_state failed but wrote its outputs");
    return;
  }
  FUZZ_ASSERT(info.amax_history_len >= 0 && info.amax_history_len <= 65536, "amax_history_len %d", info.amax_history_len);
  FUZZ_ASSERT(is_fp8(get_enum(info.fp8_dtype)), "scaling state dtype %d is not FP8", get_enum(info.fp8_dtype));
}

}  // namespace fuzz

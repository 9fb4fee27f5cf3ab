// A projection's three scaling states (scale, scale_inv, then the amax history of each)
// appended to `out` as raw floats: tests compare two runs bit for bit with it.
#pragma once

#include <vector>

#include "modules/projection/projection.h"

namespace te::test_support {

inline void append_scaling_states(Backend &be, const ProjectionState &p, std::vector<float> &out) {
  for (TensorRole r : {TensorRole::Input, TensorRole::Weight, TensorRole::GradOutput}) {
    const ScalingState &st = p.state(r);
    std::vector<float> h(static_cast<size_t>(st.history_len()));
    float s = 0, si = 0;
    st.read(be, &s, &si, h.data(), st.history_len());
    out.push_back(s);
    out.push_back(si);
    out.insert(out.end(), h.begin(), h.end());
  }
}

}  // namespace te::test_support

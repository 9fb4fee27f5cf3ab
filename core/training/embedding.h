// te_embedding_forward / te_embedding_backward: argument checks (shapes, dtypes, devices, and on
// the CPU every id in range), then one backend call.
#pragma once

#include "context/context.h"

namespace te {

// y[t, :] = table[ids[t], :]. table [vocab, dim] F32/F16/BF16; ids I32 (n elements, any shape);
// y the table's dtype, n * dim elements, last dimension dim.
void embedding_forward(Context &ctx, const TensorView &table, const TensorView &ids, const TensorView &y);

// dtable[ids[t], :] (+)= dy[t, :] in increasing t (fp32). dtable F32 [vocab, dim]; dy
// F32/F16/BF16, n * dim elements, last dimension dim.
void embedding_backward(Context &ctx, const TensorView &ids, const TensorView &dy, const TensorView &dtable,
                        bool accumulate);

}  // namespace te

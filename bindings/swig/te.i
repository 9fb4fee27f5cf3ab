/*
 * SWIG interface for libte's whole public header (te/te.h): the optional compiled accelerator of
 * the Python package, imported as libte._te_swig (build: bindings/swig/build.py).
 *
 * Conventions of the generated module:
 *  - te_status results: a failed call raises. The exception comes from the factory registered
 *    with te_swig_set_error_factory(callable(status, message) -> exception instance) - libte
 *    registers libte.errors.error_for_status - or is a RuntimeError without one. Successful calls
 *    return None, or their out-parameters.
 *  - Out-parameters are results: te_context **out -> the new handle, te_autocast_token *token ->
 *    an int, size_t *size -> an int, te_device *out -> (type, index).
 *  - Opaque handles are proxies that own what they were created with (%newobject semantics:
 *    collecting one destroys/releases it); the explicit destroy/release functions disown them
 *    (%delobject), so nothing is freed twice.
 *  - Pointers the library only passes through (data, scale_inv, streams, DLPack tensors) are
 *    Python ints (addresses); None is NULL.
 *  - A te_tensor argument is a te_tensor proxy or a tuple
 *    (data, dtype, shape, device_type, device_index, scale_inv, scaling), converted on the C
 *    stack with no allocation. An array of te_tensor pointers (GroupedLinear's weights, biases
 *    and gradients) is a list of them (None entries are NULL), an int64_t *m_splits a list of
 *    ints. Struct members that point to tensors take te_tensor proxies only (a converted tuple
 *    would dangle once the setter returns); GroupedLinear's forward-args arrays are read-only
 *    (use te_swig_grouped_linear_forward*, which take lists).
 *  - Options structs are constructed with their _init defaults (and struct_size set), as are the
 *    structs the library fills.
 *  - A te_nccl_id is bytes of length 128 both ways: te_nccl_get_unique_id() returns one,
 *    te_group_init_nccl*(..., id) takes any bytes-like object of that length (None is NULL).
 *  - Calls that may block (te_context_synchronize, the NCCL group calls) release the GIL, so
 *    that another thread can run meanwhile (e.g. a watchdog calling te_group_abort).
 *  - te_swig_* functions are call-shaped helpers for the Python package's low-level interface
 *    (options structs built in C, tensors as tuples).
 *  - Training-step ops and checkpoints: te_adamw_step(ctx, opts, params) takes params as a list
 *    of te_adamw_param proxies or 9-tuples (param, grad, exp_avg, exp_avg_sq, model_weight,
 *    weight_decay, owner_kind, owner, owner_gemm) - tensors as in any call, owner a module
 *    handle proxy, an address or None - and passes its length as count. Checkpoint record names
 *    are str (UTF-8) or bytes, te_checkpoint_name returns bytes, paths are str, bytes or
 *    os.PathLike, te_checkpoint_count returns the count; byte records go in and come out
 *    through buffers as state_save/state_load's do. te_checkpoint_record_info(ck, name) returns
 *    (is_tensor, shape, size): shape a tensor tuple (data 0; zeroed for a byte record).
 */
%module(package="libte") _te_swig

%{
#include <te/te.h>
#include <stdlib.h>
#include <string.h>

/* The training-step ops, AdamW and checkpoints are weak references, so that the module still
 * imports with a libte.so built before them (Python resolves an extension's symbols when it
 * loads it): their address is then NULL, te_swig_exports(name) says so, and calling one raises
 * Unsupported (TE_WEAK below) instead of crashing. */
#pragma weak te_add
#pragma weak te_split_columns
#pragma weak te_concat_columns
#pragma weak te_embedding_forward
#pragma weak te_embedding_backward
#pragma weak te_cross_entropy_options_init
#pragma weak te_cross_entropy
#pragma weak te_adamw_param_init
#pragma weak te_adamw_options_init
#pragma weak te_adamw_step
#pragma weak te_checkpoint_create
#pragma weak te_checkpoint_destroy
#pragma weak te_checkpoint_put_tensor
#pragma weak te_checkpoint_put_bytes
#pragma weak te_checkpoint_get_tensor
#pragma weak te_checkpoint_get_bytes
#pragma weak te_checkpoint_count
#pragma weak te_checkpoint_name
#pragma weak te_checkpoint_write
#pragma weak te_checkpoint_read
#pragma weak te_checkpoint_serialize
#pragma weak te_checkpoint_deserialize
#pragma weak te_checkpoint_record_info

static const struct {
  const char *name;
  void (*fn)(void);
} te_swig_weak[] = {
    {"te_add", (void (*)(void))te_add},
    {"te_split_columns", (void (*)(void))te_split_columns},
    {"te_concat_columns", (void (*)(void))te_concat_columns},
    {"te_embedding_forward", (void (*)(void))te_embedding_forward},
    {"te_embedding_backward", (void (*)(void))te_embedding_backward},
    {"te_cross_entropy_options_init", (void (*)(void))te_cross_entropy_options_init},
    {"te_cross_entropy", (void (*)(void))te_cross_entropy},
    {"te_adamw_param_init", (void (*)(void))te_adamw_param_init},
    {"te_adamw_options_init", (void (*)(void))te_adamw_options_init},
    {"te_adamw_step", (void (*)(void))te_adamw_step},
    {"te_checkpoint_create", (void (*)(void))te_checkpoint_create},
    {"te_checkpoint_destroy", (void (*)(void))te_checkpoint_destroy},
    {"te_checkpoint_put_tensor", (void (*)(void))te_checkpoint_put_tensor},
    {"te_checkpoint_put_bytes", (void (*)(void))te_checkpoint_put_bytes},
    {"te_checkpoint_get_tensor", (void (*)(void))te_checkpoint_get_tensor},
    {"te_checkpoint_get_bytes", (void (*)(void))te_checkpoint_get_bytes},
    {"te_checkpoint_count", (void (*)(void))te_checkpoint_count},
    {"te_checkpoint_name", (void (*)(void))te_checkpoint_name},
    {"te_checkpoint_write", (void (*)(void))te_checkpoint_write},
    {"te_checkpoint_read", (void (*)(void))te_checkpoint_read},
    {"te_checkpoint_serialize", (void (*)(void))te_checkpoint_serialize},
    {"te_checkpoint_deserialize", (void (*)(void))te_checkpoint_deserialize},
    {"te_checkpoint_record_info", (void (*)(void))te_checkpoint_record_info}
};

static PyObject *te_swig_error_factory = NULL;

/* Sets the Python error for a failed call; the caller returns NULL. */
static void te_swig_set_error(te_status status) {
  const char *message = te_last_error();
  if (te_swig_error_factory != NULL) {
    PyObject *exc = PyObject_CallFunction(te_swig_error_factory, "is", (int)status, message);
    if (exc == NULL) return; /* the factory raised: propagate that */
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return;
  }
  PyErr_Format(PyExc_RuntimeError, "%s: %s", te_status_string(status), message);
}

/* An int address (or None) -> a pointer. */
static int te_swig_address(PyObject *o, void **out) {
  if (o == Py_None) {
    *out = NULL;
    return 1;
  }
  if (PyLong_Check(o)) {
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && PyErr_Occurred()) return 0;
    *out = p;
    return 1;
  }
  PyErr_Format(PyExc_TypeError, "expected an address (int) or None, got %s", Py_TYPE(o)->tp_name);
  return 0;
}

static int te_swig_int(PyObject *o, long long *out, const char *what) {
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_TypeError, "te_tensor tuple: %s must be an int", what);
    return 0;
  }
  *out = v;
  return 1;
}

/* (data, dtype, shape, device_type, device_index, scale_inv, scaling) -> *t. */
static int te_swig_tensor_from_tuple(PyObject *o, te_tensor *t) {
  long long v;
  Py_ssize_t n, i;
  PyObject *shape;
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 7) {
    PyErr_SetString(PyExc_TypeError, "expected a te_tensor or a 7-tuple (data, dtype, shape, "
                                     "device_type, device_index, scale_inv, scaling)");
    return 0;
  }
  memset(t, 0, sizeof *t);
  if (!te_swig_address(PyTuple_GET_ITEM(o, 0), &t->data)) return 0;
  if (!te_swig_int(PyTuple_GET_ITEM(o, 1), &v, "dtype")) return 0;
  t->dtype = (te_dtype)v;
  shape = PyTuple_GET_ITEM(o, 2);
  if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > TE_MAX_DIMS) {
    PyErr_SetString(PyExc_TypeError, "te_tensor tuple: shape must be a tuple of at most "
                                     "TE_MAX_DIMS ints");
    return 0;
  }
  n = PyTuple_GET_SIZE(shape);
  t->ndim = (int32_t)n;
  for (i = 0; i < n; ++i) {
    if (!te_swig_int(PyTuple_GET_ITEM(shape, i), &v, "shape[i]")) return 0;
    t->shape[i] = (int64_t)v;
  }
  if (!te_swig_int(PyTuple_GET_ITEM(o, 3), &v, "device_type")) return 0;
  t->device.type = (te_device_type)v;
  if (!te_swig_int(PyTuple_GET_ITEM(o, 4), &v, "device_index")) return 0;
  t->device.index = (int32_t)v;
  if (!te_swig_address(PyTuple_GET_ITEM(o, 5), (void **)&t->scale_inv)) return 0;
  if (!te_swig_int(PyTuple_GET_ITEM(o, 6), &v, "scaling")) return 0;
  t->scaling = (te_scaling_mode)v;
  return 1;
}

static PyObject *te_swig_tensor_to_tuple(const te_tensor *t) {
  int n = (t->ndim >= 1 && t->ndim <= TE_MAX_DIMS) ? t->ndim : 0, i;
  PyObject *shape = PyTuple_New(n);
  if (shape == NULL) return NULL;
  for (i = 0; i < n; ++i) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(t->shape[i]));
  return Py_BuildValue("(NiNiiNi)", PyLong_FromVoidPtr(t->data), (int)t->dtype, shape,
                       (int)t->device.type, (int)t->device.index,
                       PyLong_FromVoidPtr(t->scale_inv), (int)t->scaling);
}
%}

%include <stdint.i>

/* ---- status -> exception ------------------------------------------------------------------ */

%typemap(out) te_status {
  if ($1 != TE_SUCCESS) {
    te_swig_set_error($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}

/* ---- pass-through pointers as int addresses ------------------------------------------------ */

%typemap(in) void *, const void *, float *, const float * {
  void *p_ = NULL;
  if (!te_swig_address($input, &p_)) {
    if (SWIG_ConvertPtr($input, &p_, 0, 0) != SWIG_OK) SWIG_fail; /* a SWIG pointer also works */
    PyErr_Clear();
  }
  $1 = ($1_ltype)p_;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) void *, const void *, float *, const float * {
  $1 = ($input == Py_None || PyLong_Check($input)) ? 1 : 0;
}
%typemap(out) void *, float * { $result = PyLong_FromVoidPtr((void *)$1); }
%typemap(memberin) void *, float *, const float * { $1 = $input; }

/* Byte buffers: te_linear_state_save(ctx, lin, buf, capacity, size) takes a writable buffer
 * (or None to ask for the size), te_linear_state_load a readable one. */
%typemap(in) (void *buf, size_t capacity) (Py_buffer pybuf) {
  pybuf.obj = NULL;
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    if (PyObject_GetBuffer($input, &pybuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
    $1 = pybuf.buf;
    $2 = (size_t)pybuf.len;
  }
}
%typemap(freearg) (void *buf, size_t capacity) { if (pybuf$argnum.obj) PyBuffer_Release(&pybuf$argnum); }
%typemap(in) (const void *buf, size_t size) (Py_buffer pybuf) {
  pybuf.obj = NULL;
  if (PyObject_GetBuffer($input, &pybuf, PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
  $1 = pybuf.buf;
  $2 = (size_t)pybuf.len;
}
%typemap(freearg) (const void *buf, size_t size) { if (pybuf$argnum.obj) PyBuffer_Release(&pybuf$argnum); }
/* te_checkpoint_put_bytes' record: a readable buffer, or None (NULL, size 0). */
%typemap(in) (const void *data, size_t size) (Py_buffer pybuf) {
  pybuf.obj = NULL;
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    if (PyObject_GetBuffer($input, &pybuf, PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
    $1 = pybuf.buf;
    $2 = (size_t)pybuf.len;
  }
}
%typemap(freearg) (const void *data, size_t size) { if (pybuf$argnum.obj) PyBuffer_Release(&pybuf$argnum); }
/* Checkpoint record names: str (UTF-8) or bytes, None for NULL; a NUL inside would silently name
 * another record, so it is refused. */
%typemap(in) const char *name (PyObject *bytes_ = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    char *p_ = NULL;
    Py_ssize_t n_ = 0;
    if (PyUnicode_Check($input)) {
      bytes_ = PyUnicode_AsUTF8String($input);
      if (bytes_ == NULL) SWIG_fail;
    } else if (PyBytes_Check($input)) {
      Py_INCREF($input);
      bytes_ = $input;
    } else {
      PyErr_Format(PyExc_TypeError, "argument 'name': expected str or bytes, got %s",
                   Py_TYPE($input)->tp_name);
      SWIG_fail;
    }
    if (PyBytes_AsStringAndSize(bytes_, &p_, &n_) != 0) SWIG_fail; /* ValueError on a NUL */
    $1 = p_;
  }
}
%typemap(freearg) const char *name { Py_XDECREF(bytes_$argnum); }
/* File paths: str, bytes or os.PathLike (os.fsencode's rules), None for NULL. */
%typemap(in) const char *path (PyObject *bytes_ = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (!PyUnicode_FSConverter($input, &bytes_)) SWIG_fail;
    $1 = PyBytes_AS_STRING(bytes_);
  }
}
%typemap(freearg) const char *path { Py_XDECREF(bytes_$argnum); }
%typemap(in) (float *history, size_t history_cap) (Py_buffer pybuf) {
  pybuf.obj = NULL;
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    if (PyObject_GetBuffer($input, &pybuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
    $1 = (float *)pybuf.buf;
    $2 = (size_t)pybuf.len / sizeof(float);
  }
}
%typemap(freearg) (float *history, size_t history_cap) { if (pybuf$argnum.obj) PyBuffer_Release(&pybuf$argnum); }

/* ---- out-parameters -------------------------------------------------------------------------- */

%define TE_HANDLE_OUT(TYPE)
%typemap(in, numinputs=0) TYPE **out (TYPE *temp = NULL) { $1 = &temp; }
%typemap(argout) TYPE **out {
  $result = SWIG_Python_AppendOutput($result,
      SWIG_NewPointerObj(SWIG_as_voidptr(temp$argnum), $descriptor(TYPE *), SWIG_POINTER_OWN));
}
%enddef
TE_HANDLE_OUT(te_context)
TE_HANDLE_OUT(te_recipe)
TE_HANDLE_OUT(te_group)
TE_HANDLE_OUT(te_linear)
TE_HANDLE_OUT(te_linear_backward_ctx)
TE_HANDLE_OUT(te_layernorm_linear)
TE_HANDLE_OUT(te_layernorm_linear_backward_ctx)
TE_HANDLE_OUT(te_layernorm_mlp)
TE_HANDLE_OUT(te_layernorm_mlp_backward_ctx)
TE_HANDLE_OUT(te_grouped_linear)
TE_HANDLE_OUT(te_grouped_linear_backward_ctx)
TE_HANDLE_OUT(te_attention)
TE_HANDLE_OUT(te_attention_backward_ctx)
TE_HANDLE_OUT(te_checkpoint)

%typemap(in, numinputs=0) te_autocast_token *token (te_autocast_token temp = 0) { $1 = &temp; }
%typemap(argout) te_autocast_token *token {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromUnsignedLongLong(temp$argnum));
}
%typemap(in, numinputs=0) size_t *size (size_t temp = 0) { $1 = &temp; }
%typemap(argout) size_t *size { $result = SWIG_Python_AppendOutput($result, PyLong_FromSize_t(temp$argnum)); }
%typemap(in, numinputs=0) int64_t *count (int64_t temp = 0) { $1 = &temp; }
%typemap(argout) int64_t *count { $result = SWIG_Python_AppendOutput($result, PyLong_FromLongLong(temp$argnum)); }
%typemap(in, numinputs=0) size_t *count (size_t temp = 0) { $1 = &temp; }
%typemap(argout) size_t *count { $result = SWIG_Python_AppendOutput($result, PyLong_FromSize_t(temp$argnum)); }
/* te_checkpoint_name's result: the record's name as bytes (names are bytes to the library). */
%typemap(in, numinputs=0) const char **name (const char *temp = NULL) { $1 = &temp; }
%typemap(argout) const char **name {
  PyObject *o_;
  if (temp$argnum != NULL) {
    o_ = PyBytes_FromString(temp$argnum);
  } else {
    Py_INCREF(Py_None);
    o_ = Py_None;
  }
  $result = SWIG_Python_AppendOutput($result, o_);
}
/* te_checkpoint_record_info's outputs: is_tensor as an int, then the record's shape as a tensor
 * tuple (zeroed: dtype 0, shape () for a byte record, which the library leaves untouched), then
 * size (the size_t *size typemap above). */
%typemap(in, numinputs=0) int32_t *is_tensor (int32_t temp = 0) { $1 = &temp; }
%typemap(argout) int32_t *is_tensor { $result = SWIG_Python_AppendOutput($result, PyLong_FromLong(temp$argnum)); }
%typemap(in, numinputs=0) te_tensor *shape (te_tensor temp) { memset(&temp, 0, sizeof temp); $1 = &temp; }
%typemap(argout) te_tensor *shape { $result = SWIG_Python_AppendOutput($result, te_swig_tensor_to_tuple(&temp$argnum)); }
%typemap(in, numinputs=0) te_device *out (te_device temp) { memset(&temp, 0, sizeof temp); $1 = &temp; }
%typemap(argout) te_device *out {
  $result = SWIG_Python_AppendOutput($result, Py_BuildValue("(ii)", (int)temp$argnum.type, (int)temp$argnum.index));
}
/* te_tensor_from_dlpack's result, as a tuple (declared below with this parameter name). */
%typemap(in, numinputs=0) te_tensor *dlpack_out (te_tensor temp) { memset(&temp, 0, sizeof temp); $1 = &temp; }
%typemap(argout) te_tensor *dlpack_out { $result = SWIG_Python_AppendOutput($result, te_swig_tensor_to_tuple(&temp$argnum)); }

/* ---- te_nccl_id: 128 bytes, as Python bytes ---------------------------------------------------- */

%ignore te_nccl_id; /* no proxy class: ids are bytes */
%typemap(in, numinputs=0) te_nccl_id *out (te_nccl_id temp) { memset(&temp, 0, sizeof temp); $1 = &temp; }
%typemap(argout) te_nccl_id *out {
  $result = SWIG_Python_AppendOutput($result,
      PyBytes_FromStringAndSize(temp$argnum.internal, (Py_ssize_t)sizeof temp$argnum.internal));
}
%typemap(in) const te_nccl_id *id (te_nccl_id temp, Py_buffer pybuf) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    if (PyObject_GetBuffer($input, &pybuf, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Format(PyExc_TypeError, "argument 'id': expected bytes of length %d (a te_nccl_id), "
                   "got %s", (int)sizeof temp.internal, Py_TYPE($input)->tp_name);
      SWIG_fail;
    }
    if (pybuf.len != (Py_ssize_t)sizeof temp.internal) {
      PyErr_Format(PyExc_ValueError, "argument 'id': expected %d bytes (a te_nccl_id), got %zd",
                   (int)sizeof temp.internal, pybuf.len);
      PyBuffer_Release(&pybuf);
      SWIG_fail;
    }
    memcpy(temp.internal, pybuf.buf, sizeof temp.internal);
    PyBuffer_Release(&pybuf);
    $1 = &temp;
  }
}

/* ---- calls that may block: without the GIL ------------------------------------------------------ */

%define TE_ALLOW_THREADS(NAME)
%exception NAME {
  Py_BEGIN_ALLOW_THREADS
  $action
  Py_END_ALLOW_THREADS
}
%enddef
TE_ALLOW_THREADS(te_context_synchronize)
TE_ALLOW_THREADS(te_nccl_get_unique_id)
TE_ALLOW_THREADS(te_group_create_nccl)
TE_ALLOW_THREADS(te_group_init_nccl)
TE_ALLOW_THREADS(te_group_init_nccl_with_options)
TE_ALLOW_THREADS(te_group_abort)
TE_ALLOW_THREADS(te_group_destroy)

/* ---- te_tensor arguments: a proxy or a tuple, converted on the stack ------------------------- */

%define TE_TENSOR_IN(TYPE)
%typemap(in) TYPE (te_tensor temp) {
  if ($input == Py_None) {
    $1 = NULL;
  } else if (PyTuple_Check($input)) {
    if (!te_swig_tensor_from_tuple($input, &temp)) SWIG_fail;
    $1 = &temp;
  } else {
    void *p_ = NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr($input, &p_, $descriptor(te_tensor *), 0))) {
      PyErr_Format(PyExc_TypeError, "argument '$1_name': expected a te_tensor or a tensor "
                   "tuple, got %s", Py_TYPE($input)->tp_name);
      SWIG_fail;
    }
    $1 = (te_tensor *)p_;
  }
}
%enddef
TE_TENSOR_IN(const te_tensor *)
TE_TENSOR_IN(te_tensor *)

/* Struct members holding te_tensor pointers take proxies only: a stack copy would dangle. The
 * names are the members' (te_linear_forward_args, te_gemm_options, te_norm_forward_args, the
 * transformer modules' forward args and grads); functions of te.h whose parameters share a
 * name with one (dx, dw, db) are declared again below with other parameter names. */
%typemap(in) const te_tensor *input, const te_tensor *weight, const te_tensor *bias,
             te_tensor *gelu_input, te_tensor *output, te_tensor *output_t, te_tensor *mu,
             te_tensor *rsigma, const te_tensor *ln_weight, const te_tensor *ln_bias,
             const te_tensor *fc1_weight, const te_tensor *fc1_bias,
             const te_tensor *fc2_weight, const te_tensor *fc2_bias, te_tensor *ln_out,
             te_tensor *dx, te_tensor *dln_weight, te_tensor *dln_bias, te_tensor *dw,
             te_tensor *db, te_tensor *dfc1_weight, te_tensor *dfc1_bias,
             te_tensor *dfc2_weight, te_tensor *dfc2_bias, const te_tensor *q,
             const te_tensor *k, const te_tensor *v, const te_tensor *cu_seqlens_q,
             const te_tensor *cu_seqlens_kv, te_tensor *dq, te_tensor *dk, te_tensor *dv,
             te_tensor *param, const te_tensor *grad, te_tensor *exp_avg,
             te_tensor *exp_avg_sq, te_tensor *model_weight {
  void *p_ = NULL;
  if (!SWIG_IsOK(SWIG_ConvertPtr($input, &p_, $descriptor(te_tensor *), 0))) {
    PyErr_SetString(PyExc_TypeError, "expected a te_tensor proxy (or None)");
    SWIG_fail;
  }
  $1 = (te_tensor *)p_;
}

/* Arrays of te_tensor pointers: a list (or tuple) of te_tensor proxies, tensor tuples or None
 * (NULL), or None for a NULL array. The C array always has TE_GROUPED_LINEAR_MAX_GEMMS
 * pointers, NULL past the list: the library reads num_gemms of them, so a short list is its
 * error naming the missing element, never a read past the array. */
%define TE_TENSOR_ARRAY_IN(TYPE)
%typemap(in) TYPE (void *block = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    Py_ssize_t n_, i_;
    te_tensor **ptrs_;
    te_tensor *tensors_;
    PyObject *seq_ = PySequence_Fast($input, "expected a list of te_tensor proxies or tensor tuples, or None");
    if (seq_ == NULL) SWIG_fail;
    n_ = PySequence_Fast_GET_SIZE(seq_);
    if (n_ > TE_GROUPED_LINEAR_MAX_GEMMS) {
      Py_DECREF(seq_);
      PyErr_Format(PyExc_ValueError, "argument '$1_name': expected at most %d tensors "
                   "(TE_GROUPED_LINEAR_MAX_GEMMS), got %zd", TE_GROUPED_LINEAR_MAX_GEMMS, n_);
      SWIG_fail;
    }
    block = calloc(1, TE_GROUPED_LINEAR_MAX_GEMMS * sizeof(te_tensor *) + (size_t)n_ * sizeof(te_tensor));
    if (block == NULL) {
      Py_DECREF(seq_);
      PyErr_NoMemory();
      SWIG_fail;
    }
    ptrs_ = (te_tensor **)block;
    tensors_ = (te_tensor *)(ptrs_ + TE_GROUPED_LINEAR_MAX_GEMMS);
    for (i_ = 0; i_ < n_; ++i_) {
      PyObject *item_ = PySequence_Fast_GET_ITEM(seq_, i_);
      if (item_ == Py_None) continue;
      if (PyTuple_Check(item_)) {
        if (!te_swig_tensor_from_tuple(item_, &tensors_[i_])) { Py_DECREF(seq_); SWIG_fail; }
        ptrs_[i_] = &tensors_[i_];
      } else {
        void *p_ = NULL;
        if (!SWIG_IsOK(SWIG_ConvertPtr(item_, &p_, $descriptor(te_tensor *), 0))) {
          Py_DECREF(seq_);
          PyErr_Format(PyExc_TypeError, "argument '$1_name'[%zd]: expected a te_tensor, a tensor "
                       "tuple or None, got %s", i_, Py_TYPE(item_)->tp_name);
          SWIG_fail;
        }
        ptrs_[i_] = (te_tensor *)p_;
      }
    }
    Py_DECREF(seq_);
    $1 = ($1_ltype)ptrs_;
  }
}
%typemap(freearg) TYPE { free(block$argnum); }
%enddef
TE_TENSOR_ARRAY_IN(const te_tensor *const *)
TE_TENSOR_ARRAY_IN(te_tensor *const *)

/* te_adamw_step's parameter list: a list (or tuple) whose items are te_adamw_param proxies or
 * 9-tuples (param, grad, exp_avg, exp_avg_sq, model_weight, weight_decay, owner_kind, owner,
 * owner_gemm): tensors as te_tensor proxies, tensor tuples or None; owner a module handle proxy
 * of any kind (the library checks it against owner_kind), an address or None. None is a NULL
 * list of count 0. One block holds the entries and the tensors converted from tuples. */
%{
static int te_swig_tensor_item(PyObject *item, te_tensor *storage, te_tensor **out,
                               Py_ssize_t index, const char *field) {
  void *p_ = NULL;
  if (item == Py_None) {
    *out = NULL;
    return 1;
  }
  if (PyTuple_Check(item)) {
    if (!te_swig_tensor_from_tuple(item, storage)) return 0;
    *out = storage;
    return 1;
  }
  if (!SWIG_IsOK(SWIG_ConvertPtr(item, &p_, SWIGTYPE_p_te_tensor, 0))) {
    PyErr_Format(PyExc_TypeError, "argument 'params'[%zd].%s: expected a te_tensor, a tensor "
                 "tuple or None, got %s", index, field, Py_TYPE(item)->tp_name);
    return 0;
  }
  *out = (te_tensor *)p_;
  return 1;
}

static int te_swig_int_item(PyObject *item, long long *out, Py_ssize_t index, const char *field) {
  long long v = PyLong_AsLongLong(item);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_TypeError, "argument 'params'[%zd].%s: expected an int", index, field);
    return 0;
  }
  *out = v;
  return 1;
}

/* One list item into entry i of the block. */
static int te_swig_adamw_item(PyObject *item, te_adamw_param *entry, te_tensor *tensors,
                              Py_ssize_t i) {
  static const char *const fields[5] = {"param", "grad", "exp_avg", "exp_avg_sq", "model_weight"};
  te_tensor *ptrs[5];
  long long v[3];
  void *owner = NULL;
  int k;
  if (!PyTuple_Check(item)) {
    void *p_ = NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(item, &p_, SWIGTYPE_p_te_adamw_param, 0)) || p_ == NULL) {
      PyErr_Format(PyExc_TypeError, "argument 'params'[%zd]: expected a te_adamw_param or a "
                   "9-tuple (param, grad, exp_avg, exp_avg_sq, model_weight, weight_decay, "
                   "owner_kind, owner, owner_gemm), got %s", i, Py_TYPE(item)->tp_name);
      return 0;
    }
    *entry = *(const te_adamw_param *)p_;
    return 1;
  }
  if (PyTuple_GET_SIZE(item) != 9) {
    PyErr_Format(PyExc_TypeError, "argument 'params'[%zd]: expected a 9-tuple (param, grad, "
                 "exp_avg, exp_avg_sq, model_weight, weight_decay, owner_kind, owner, "
                 "owner_gemm), got %zd items", i, PyTuple_GET_SIZE(item));
    return 0;
  }
  for (k = 0; k < 5; ++k)
    if (!te_swig_tensor_item(PyTuple_GET_ITEM(item, k), &tensors[k], &ptrs[k], i, fields[k]))
      return 0;
  if (!te_swig_int_item(PyTuple_GET_ITEM(item, 5), &v[0], i, "weight_decay")) return 0;
  if (!te_swig_int_item(PyTuple_GET_ITEM(item, 6), &v[1], i, "owner_kind")) return 0;
  if (!te_swig_int_item(PyTuple_GET_ITEM(item, 8), &v[2], i, "owner_gemm")) return 0;
  {
    PyObject *o_ = PyTuple_GET_ITEM(item, 7);
    if (o_ != Py_None && !PyLong_Check(o_) && !SWIG_IsOK(SWIG_ConvertPtr(o_, &owner, 0, 0))) {
      PyErr_Format(PyExc_TypeError, "argument 'params'[%zd].owner: expected a module handle, an "
                   "address or None, got %s", i, Py_TYPE(o_)->tp_name);
      return 0;
    }
    if (o_ != Py_None && PyLong_Check(o_) && !te_swig_address(o_, &owner)) return 0;
  }
  te_adamw_param_init(entry);
  entry->param = ptrs[0];
  entry->grad = ptrs[1];
  entry->exp_avg = ptrs[2];
  entry->exp_avg_sq = ptrs[3];
  entry->model_weight = ptrs[4];
  entry->weight_decay = (int32_t)v[0];
  entry->owner_kind = (te_module_kind)v[1];
  entry->owner = owner;
  entry->owner_gemm = (int32_t)v[2];
  return 1;
}
%}
%typemap(in) (const te_adamw_param *params, size_t count) (void *block = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else {
    Py_ssize_t n_, i_;
    te_adamw_param *entries_;
    te_tensor *tensors_;
    PyObject *seq_ = PySequence_Fast($input, "argument 'params': expected a list of "
                                             "te_adamw_param proxies or 9-tuples, or None");
    if (seq_ == NULL) SWIG_fail;
    n_ = PySequence_Fast_GET_SIZE(seq_);
    block = calloc(1, (size_t)(n_ > 0 ? n_ : 1) * (sizeof(te_adamw_param) + 5 * sizeof(te_tensor)));
    if (block == NULL) {
      Py_DECREF(seq_);
      PyErr_NoMemory();
      SWIG_fail;
    }
    entries_ = (te_adamw_param *)block;
    tensors_ = (te_tensor *)(entries_ + (n_ > 0 ? n_ : 1));
    for (i_ = 0; i_ < n_; ++i_) {
      if (!te_swig_adamw_item(PySequence_Fast_GET_ITEM(seq_, i_), &entries_[i_], &tensors_[5 * i_], i_)) {
        Py_DECREF(seq_);
        SWIG_fail;
      }
    }
    Py_DECREF(seq_);
    $1 = entries_;
    $2 = (size_t)n_;
  }
}
%typemap(freearg) (const te_adamw_param *params, size_t count) { free(block$argnum); }

/* m_splits: a list of ints (a host int64_t array of TE_GROUPED_LINEAR_MAX_GEMMS, zero past the
 * list). */
%typemap(in) const int64_t *m_splits (int64_t *splits = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    Py_ssize_t n_, i_;
    PyObject *seq_ = PySequence_Fast($input, "argument 'm_splits': expected a list of ints");
    if (seq_ == NULL) SWIG_fail;
    n_ = PySequence_Fast_GET_SIZE(seq_);
    if (n_ > TE_GROUPED_LINEAR_MAX_GEMMS) {
      Py_DECREF(seq_);
      PyErr_Format(PyExc_ValueError, "argument 'm_splits': expected at most %d counts, got %zd",
                   TE_GROUPED_LINEAR_MAX_GEMMS, n_);
      SWIG_fail;
    }
    splits = (int64_t *)calloc(TE_GROUPED_LINEAR_MAX_GEMMS, sizeof *splits);
    if (splits == NULL) {
      Py_DECREF(seq_);
      PyErr_NoMemory();
      SWIG_fail;
    }
    for (i_ = 0; i_ < n_; ++i_) {
      long long v_ = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq_, i_));
      if (v_ == -1 && PyErr_Occurred()) { Py_DECREF(seq_); SWIG_fail; }
      splits[i_] = (int64_t)v_;
    }
    Py_DECREF(seq_);
    $1 = splits;
  }
}
%typemap(freearg) const int64_t *m_splits { free(splits$argnum); }

/* GroupedLinear's forward-args arrays: a setter would store a pointer to freed memory. */
%immutable te_grouped_linear_forward_args::m_splits;
%immutable te_grouped_linear_forward_args::weights;
%immutable te_grouped_linear_forward_args::biases;

/* ---- opaque handles owned by their proxies --------------------------------------------------- */

%define TE_OPAQUE(TYPE, DESTROY)
%nodefaultctor TYPE;
struct TYPE {};
%extend TYPE {
  ~TYPE() { DESTROY($self); }
}
%delobject DESTROY;
%enddef
TE_OPAQUE(te_context, te_context_destroy)
TE_OPAQUE(te_recipe, te_recipe_release)
TE_OPAQUE(te_group, te_group_destroy)
TE_OPAQUE(te_linear, te_linear_destroy)
TE_OPAQUE(te_linear_backward_ctx, te_linear_backward_ctx_destroy)
TE_OPAQUE(te_layernorm_linear, te_layernorm_linear_destroy)
TE_OPAQUE(te_layernorm_linear_backward_ctx, te_layernorm_linear_backward_ctx_destroy)
TE_OPAQUE(te_layernorm_mlp, te_layernorm_mlp_destroy)
TE_OPAQUE(te_layernorm_mlp_backward_ctx, te_layernorm_mlp_backward_ctx_destroy)
#ifndef TE_SWIG_WITHOUT_GROUPED_LINEAR
TE_OPAQUE(te_grouped_linear, te_grouped_linear_destroy)
TE_OPAQUE(te_grouped_linear_backward_ctx, te_grouped_linear_backward_ctx_destroy)
#endif
#ifndef TE_SWIG_WITHOUT_ATTENTION
TE_OPAQUE(te_attention, te_attention_destroy)
TE_OPAQUE(te_attention_backward_ctx, te_attention_backward_ctx_destroy)
#endif
TE_OPAQUE(te_checkpoint, te_checkpoint_destroy)
/* A retained reference is a new owner. */
%newobject te_recipe_retain;

/* ---- structs: constructed with defaults and struct_size -------------------------------------- */

%extend te_context_options { te_context_options() { te_context_options *o = calloc(1, sizeof *o); te_context_options_init(o); return o; } }
%extend te_recipe_options {
  te_recipe_options(int kind = 0) {
    te_recipe_options *o = calloc(1, sizeof *o);
    if (te_recipe_options_init(o, (te_recipe_kind)kind) != TE_SUCCESS) o->struct_size = sizeof *o;
    return o;
  }
}
%extend te_group_nccl_options { te_group_nccl_options() { te_group_nccl_options *o = calloc(1, sizeof *o); te_group_nccl_options_init(o); return o; } }
%extend te_autocast_options { te_autocast_options() { te_autocast_options *o = calloc(1, sizeof *o); te_autocast_options_init(o); return o; } }
%extend te_linear_options { te_linear_options() { te_linear_options *o = calloc(1, sizeof *o); te_linear_options_init(o); return o; } }
%extend te_linear_forward_args { te_linear_forward_args() { te_linear_forward_args *o = calloc(1, sizeof *o); te_linear_forward_args_init(o); return o; } }
%extend te_linear_backward_args { te_linear_backward_args() { te_linear_backward_args *o = calloc(1, sizeof *o); te_linear_backward_args_init(o); return o; } }
%extend te_quantize_options { te_quantize_options() { te_quantize_options *o = calloc(1, sizeof *o); te_quantize_options_init(o); return o; } }
%extend te_gemm_options { te_gemm_options() { te_gemm_options *o = calloc(1, sizeof *o); te_gemm_options_init(o); return o; } }
%extend te_norm_options { te_norm_options() { te_norm_options *o = calloc(1, sizeof *o); te_norm_options_init(o); return o; } }
%extend te_norm_forward_args { te_norm_forward_args() { te_norm_forward_args *o = calloc(1, sizeof *o); te_norm_forward_args_init(o); return o; } }
%extend te_context_stats { te_context_stats() { te_context_stats *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; } }
%extend te_autocast_state { te_autocast_state() { te_autocast_state *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; } }
%extend te_scaling_state_info { te_scaling_state_info() { te_scaling_state_info *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; } }
%extend te_linear_residuals {
  te_linear_residuals() { te_linear_residuals *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; }
  /* Residuals never handed to forward_save are freed with their proxy. */
  ~te_linear_residuals() { te_linear_residuals_release($self); free($self); }
}
%extend te_layernorm_linear_options { te_layernorm_linear_options() { te_layernorm_linear_options *o = calloc(1, sizeof *o); te_layernorm_linear_options_init(o); return o; } }
%extend te_layernorm_linear_forward_args { te_layernorm_linear_forward_args() { te_layernorm_linear_forward_args *o = calloc(1, sizeof *o); te_layernorm_linear_forward_args_init(o); return o; } }
%extend te_layernorm_linear_grads { te_layernorm_linear_grads() { te_layernorm_linear_grads *o = calloc(1, sizeof *o); te_layernorm_linear_grads_init(o); return o; } }
%extend te_layernorm_mlp_options { te_layernorm_mlp_options() { te_layernorm_mlp_options *o = calloc(1, sizeof *o); te_layernorm_mlp_options_init(o); return o; } }
%extend te_layernorm_mlp_forward_args { te_layernorm_mlp_forward_args() { te_layernorm_mlp_forward_args *o = calloc(1, sizeof *o); te_layernorm_mlp_forward_args_init(o); return o; } }
%extend te_layernorm_mlp_grads { te_layernorm_mlp_grads() { te_layernorm_mlp_grads *o = calloc(1, sizeof *o); te_layernorm_mlp_grads_init(o); return o; } }
#ifndef TE_SWIG_WITHOUT_GROUPED_LINEAR
%extend te_grouped_linear_options { te_grouped_linear_options() { te_grouped_linear_options *o = calloc(1, sizeof *o); te_grouped_linear_options_init(o); return o; } }
%extend te_grouped_linear_forward_args { te_grouped_linear_forward_args() { te_grouped_linear_forward_args *o = calloc(1, sizeof *o); te_grouped_linear_forward_args_init(o); return o; } }
#endif
%extend te_layernorm_linear_residuals {
  te_layernorm_linear_residuals() { te_layernorm_linear_residuals *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; }
  ~te_layernorm_linear_residuals() { te_layernorm_linear_residuals_release($self); free($self); }
}
%extend te_layernorm_mlp_residuals {
  te_layernorm_mlp_residuals() { te_layernorm_mlp_residuals *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; }
  ~te_layernorm_mlp_residuals() { te_layernorm_mlp_residuals_release($self); free($self); }
}
#ifndef TE_SWIG_WITHOUT_GROUPED_LINEAR
%extend te_grouped_linear_residuals {
  te_grouped_linear_residuals() { te_grouped_linear_residuals *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; }
  ~te_grouped_linear_residuals() { te_grouped_linear_residuals_release($self); free($self); }
}
#endif
#ifndef TE_SWIG_WITHOUT_ATTENTION
%extend te_attention_options { te_attention_options() { te_attention_options *o = calloc(1, sizeof *o); te_attention_options_init(o); return o; } }
%extend te_attention_forward_args { te_attention_forward_args() { te_attention_forward_args *o = calloc(1, sizeof *o); te_attention_forward_args_init(o); return o; } }
%extend te_attention_grads { te_attention_grads() { te_attention_grads *o = calloc(1, sizeof *o); te_attention_grads_init(o); return o; } }
%extend te_rope_options { te_rope_options() { te_rope_options *o = calloc(1, sizeof *o); te_rope_options_init(o); return o; } }
%extend te_attention_residuals {
  te_attention_residuals() { te_attention_residuals *o = calloc(1, sizeof *o); o->struct_size = sizeof *o; return o; }
  ~te_attention_residuals() { te_attention_residuals_release($self); free($self); }
}
#endif
/* These _init functions are weak (see te_swig_exports): without them, struct_size only. */
%extend te_cross_entropy_options { te_cross_entropy_options() { te_cross_entropy_options *o = calloc(1, sizeof *o); if (te_cross_entropy_options_init) te_cross_entropy_options_init(o); else o->struct_size = sizeof *o; return o; } }
%extend te_adamw_param { te_adamw_param() { te_adamw_param *o = calloc(1, sizeof *o); if (te_adamw_param_init) te_adamw_param_init(o); else o->struct_size = sizeof *o; return o; } }
%extend te_adamw_options { te_adamw_options() { te_adamw_options *o = calloc(1, sizeof *o); if (te_adamw_options_init) te_adamw_options_init(o); else o->struct_size = sizeof *o; return o; } }
%extend te_tensor {
  /* (data, dtype, shape, device_type, device_index, scale_inv, scaling) */
  PyObject *as_tuple() { return te_swig_tensor_to_tuple($self); }
}

/* ---- the header -------------------------------------------------------------------------------- */

%ignore te_tensor_from_dlpack;
/* Declared again below: their parameters dx, dw, db share names with struct members that take
 * proxies only, and as parameters they take tuples too. */
%ignore te_linear_backward;
%ignore te_activation_backward;
%ignore te_norm_backward;
%ignore te_grouped_linear_backward;
%ignore te_rope_backward;
#ifdef TE_SWIG_WITHOUT_ATTENTION
/* build.py: this libte.so predates attention and RoPE (te_attention_*, te_rope_*). */
%rename("$ignore", regextarget=1) "^te_attention_";
%rename("$ignore", regextarget=1) "^te_rope_";
#endif
#ifdef TE_SWIG_WITHOUT_GROUPED_LINEAR
/* build.py: this libte.so predates GroupedLinear (wrapping its functions would make the module
 * fail to import). */
%rename("$ignore", regextarget=1) "^te_grouped_linear_";
#endif
/* Weak functions (see the top of this file): a call to one the loaded libte.so lacks raises
 * Unsupported. */
%{
static void te_swig_missing(const char *name) {
  char message[256];
  snprintf(message, sizeof message, "%s: the loaded libte.so (%s) does not export it; rebuild "
           "libte", name, te_version_string());
  if (te_swig_error_factory != NULL) {
    PyObject *exc = PyObject_CallFunction(te_swig_error_factory, "is", (int)TE_ERROR_UNSUPPORTED,
                                          message);
    if (exc == NULL) return;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return;
  }
  PyErr_Format(PyExc_NotImplementedError, "%s", message);
}
%}
%define TE_WEAK(NAME)
%exception NAME {
  if (NAME == NULL) {
    te_swig_missing("NAME");
    SWIG_fail;
  }
  $action
}
%enddef
TE_WEAK(te_add)
TE_WEAK(te_split_columns)
TE_WEAK(te_concat_columns)
TE_WEAK(te_embedding_forward)
TE_WEAK(te_embedding_backward)
TE_WEAK(te_cross_entropy_options_init)
TE_WEAK(te_cross_entropy)
TE_WEAK(te_adamw_param_init)
TE_WEAK(te_adamw_options_init)
TE_WEAK(te_adamw_step)
TE_WEAK(te_checkpoint_create)
TE_WEAK(te_checkpoint_put_tensor)
TE_WEAK(te_checkpoint_put_bytes)
TE_WEAK(te_checkpoint_get_tensor)
TE_WEAK(te_checkpoint_get_bytes)
TE_WEAK(te_checkpoint_count)
TE_WEAK(te_checkpoint_name)
TE_WEAK(te_checkpoint_write)
TE_WEAK(te_checkpoint_read)
TE_WEAK(te_checkpoint_serialize)
TE_WEAK(te_checkpoint_deserialize)
TE_WEAK(te_checkpoint_record_info)
%exception te_checkpoint_destroy {
  if (te_checkpoint_destroy != NULL) { $action }
}

#define TE_API
%include <te/te.h>

%rename(te_linear_backward) te_swig_decl_linear_backward;
%rename(te_activation_backward) te_swig_decl_activation_backward;
%rename(te_norm_backward) te_swig_decl_norm_backward;
%rename(te_grouped_linear_backward) te_swig_decl_grouped_linear_backward;
%rename(te_rope_backward) te_swig_decl_rope_backward;
%inline %{
te_status te_swig_decl_linear_backward(te_context *ctx, te_linear_backward_ctx *bwd,
                                       const te_tensor *dy, te_tensor *grad_x, te_tensor *grad_w,
                                       te_tensor *grad_b, const te_linear_backward_args *args) {
  return te_linear_backward(ctx, bwd, dy, grad_x, grad_w, grad_b, args);
}
te_status te_swig_decl_activation_backward(te_context *ctx, te_activation act, const te_tensor *x,
                                           const te_tensor *dy, te_tensor *grad_x) {
  return te_activation_backward(ctx, act, x, dy, grad_x);
}
te_status te_swig_decl_norm_backward(te_context *ctx, const te_norm_options *opts,
                                     const te_tensor *dy, const te_tensor *x,
                                     const te_tensor *gamma, const te_tensor *mu_in,
                                     const te_tensor *rsigma_in, te_tensor *grad_x,
                                     te_tensor *dgamma, te_tensor *dbeta) {
  return te_norm_backward(ctx, opts, dy, x, gamma, mu_in, rsigma_in, grad_x, dgamma, dbeta);
}
#ifndef TE_SWIG_WITHOUT_GROUPED_LINEAR
te_status te_swig_decl_grouped_linear_backward(te_context *ctx, te_grouped_linear_backward_ctx *bwd,
                                               const te_tensor *dy, te_tensor *grad_x,
                                               te_tensor *const *grad_ws, te_tensor *const *grad_bs,
                                               const te_linear_backward_args *args) {
  return te_grouped_linear_backward(ctx, bwd, dy, grad_x, grad_ws, grad_bs, args);
}
#endif
#ifndef TE_SWIG_WITHOUT_ATTENTION
te_status te_swig_decl_rope_backward(te_context *ctx, const te_rope_options *opts,
                                     const te_tensor *dy, const te_tensor *freqs,
                                     const te_tensor *cu_seqlens, te_tensor *grad_x) {
  return te_rope_backward(ctx, opts, dy, freqs, cu_seqlens, grad_x);
}
#endif
%}

/* te_tensor_from_dlpack(dl_managed_tensor, versioned, fp8_dtype) -> tensor tuple, where
 * dl_managed_tensor is the DLManagedTensor(Versioned)'s address (PyCapsule_GetPointer). */
%rename(te_tensor_from_dlpack) te_swig_tensor_from_dlpack;
%inline %{
te_status te_swig_tensor_from_dlpack(te_tensor *dlpack_out, const void *dl_managed_tensor,
                                     int versioned, te_dtype fp8_dtype) {
  return te_tensor_from_dlpack(dlpack_out, dl_managed_tensor, versioned, fp8_dtype);
}
%}

/* ---- helpers for the Python package's low-level interface --------------------------------------- */

%inline %{
/* Registers callable(status, message) -> exception instance, used for every failed call. */
PyObject *te_swig_set_error_factory(PyObject *factory) {
  Py_XDECREF(te_swig_error_factory);
  te_swig_error_factory = NULL;
  if (factory != Py_None) {
    Py_INCREF(factory);
    te_swig_error_factory = factory;
  }
  Py_RETURN_NONE;
}

/* Whether the loaded libte.so has the weak function `fn` (see the top of this file); functions
 * linked normally are always there. */
int te_swig_exports(const char *fn) {
  size_t i;
  for (i = 0; i < sizeof te_swig_weak / sizeof te_swig_weak[0]; ++i)
    if (strcmp(fn, te_swig_weak[i].name) == 0) return te_swig_weak[i].fn != NULL;
  return 1;
}

size_t te_swig_sizeof(const char *name) {
#define TE_SWIG_SIZE(T) if (strcmp(name, #T) == 0) return sizeof(T)
  TE_SWIG_SIZE(te_tensor); TE_SWIG_SIZE(te_context_options); TE_SWIG_SIZE(te_context_stats);
  TE_SWIG_SIZE(te_recipe_options); TE_SWIG_SIZE(te_nccl_id); TE_SWIG_SIZE(te_group_nccl_options);
  TE_SWIG_SIZE(te_autocast_options);
  TE_SWIG_SIZE(te_autocast_state); TE_SWIG_SIZE(te_linear_options);
  TE_SWIG_SIZE(te_linear_forward_args); TE_SWIG_SIZE(te_linear_residuals);
  TE_SWIG_SIZE(te_linear_backward_args); TE_SWIG_SIZE(te_scaling_state_info);
  TE_SWIG_SIZE(te_quantize_options); TE_SWIG_SIZE(te_gemm_options);
  TE_SWIG_SIZE(te_norm_options); TE_SWIG_SIZE(te_norm_forward_args);
  TE_SWIG_SIZE(te_layernorm_linear_options); TE_SWIG_SIZE(te_layernorm_linear_forward_args);
  TE_SWIG_SIZE(te_layernorm_linear_residuals); TE_SWIG_SIZE(te_layernorm_linear_grads);
  TE_SWIG_SIZE(te_layernorm_mlp_options); TE_SWIG_SIZE(te_layernorm_mlp_forward_args);
  TE_SWIG_SIZE(te_layernorm_mlp_residuals); TE_SWIG_SIZE(te_layernorm_mlp_grads);
  TE_SWIG_SIZE(te_grouped_linear_options); TE_SWIG_SIZE(te_grouped_linear_forward_args);
  TE_SWIG_SIZE(te_grouped_linear_residuals); TE_SWIG_SIZE(te_attention_options);
  TE_SWIG_SIZE(te_attention_forward_args); TE_SWIG_SIZE(te_attention_residuals);
  TE_SWIG_SIZE(te_attention_grads); TE_SWIG_SIZE(te_rope_options);
  TE_SWIG_SIZE(te_cross_entropy_options); TE_SWIG_SIZE(te_adamw_param);
  TE_SWIG_SIZE(te_adamw_options);
#undef TE_SWIG_SIZE
  return 0;
}

PyObject *te_swig_residuals_tensors(const te_linear_residuals *r) {
  return Py_BuildValue("(NNN)", te_swig_tensor_to_tuple(&r->input_t),
                       te_swig_tensor_to_tuple(&r->weight_t), PyBool_FromLong(r->fp8));
}

te_status te_swig_linear_forward_compute(te_context *ctx, te_linear *lin, const te_tensor *x,
                                         const te_tensor *w, const te_tensor *b,
                                         int weight_unchanged, te_tensor *y,
                                         te_linear_residuals *residuals) {
  te_linear_forward_args args;
  te_linear_forward_args_init(&args);
  args.input = x;
  args.weight = w;
  args.bias = b;
  args.weight_unchanged = weight_unchanged ? 1 : 0;
  return te_linear_forward_compute(ctx, lin, &args, y, residuals);
}

te_status te_swig_linear_forward(te_context *ctx, te_linear *lin, const te_tensor *x,
                                 const te_tensor *w, const te_tensor *b, int weight_unchanged,
                                 te_tensor *y, te_linear_backward_ctx **out) {
  te_linear_forward_args args;
  te_linear_forward_args_init(&args);
  args.input = x;
  args.weight = w;
  args.bias = b;
  args.weight_unchanged = weight_unchanged ? 1 : 0;
  return te_linear_forward(ctx, lin, &args, y, out);
}

te_status te_swig_linear_backward(te_context *ctx, te_linear_backward_ctx *bwd,
                                  const te_tensor *dy, te_tensor *grad_x, te_tensor *grad_w,
                                  te_tensor *grad_b, int once) {
  te_linear_backward_args args;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_linear_backward(ctx, bwd, dy, grad_x, grad_w, grad_b, &args);
}

/* Residuals in the caller's memory: residuals is an address (int; None is NULL). */
te_status te_swig_linear_residuals_size(te_context *ctx, const te_linear *lin, const te_tensor *x,
                                        const te_tensor *w, const te_tensor *b, size_t *size) {
  te_linear_forward_args args;
  te_linear_forward_args_init(&args);
  args.input = x;
  args.weight = w;
  args.bias = b;
  return te_linear_residuals_size(ctx, lin, &args, size);
}

te_status te_swig_linear_forward_compute_into(te_context *ctx, te_linear *lin, const te_tensor *x,
                                              const te_tensor *w, const te_tensor *b,
                                              int weight_unchanged, te_tensor *y,
                                              void *residuals, size_t residuals_bytes) {
  te_linear_forward_args args;
  te_linear_forward_args_init(&args);
  args.input = x;
  args.weight = w;
  args.bias = b;
  args.weight_unchanged = weight_unchanged ? 1 : 0;
  return te_linear_forward_compute_into(ctx, lin, &args, y, residuals, residuals_bytes);
}

/* x, w and b all None: inputs NULL (after an FP8 forward). */
te_status te_swig_linear_backward_from(te_context *ctx, te_linear *lin, const te_tensor *x,
                                       const te_tensor *w, const te_tensor *b,
                                       const void *residuals, size_t residuals_bytes,
                                       const te_tensor *dy, te_tensor *grad_x, te_tensor *grad_w,
                                       te_tensor *grad_b, int once) {
  te_linear_forward_args inputs;
  te_linear_backward_args args;
  te_linear_forward_args_init(&inputs);
  inputs.input = x;
  inputs.weight = w;
  inputs.bias = b;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_linear_backward_from(ctx, lin, (x || w || b) ? &inputs : NULL, residuals,
                                 residuals_bytes, dy, grad_x, grad_w, grad_b, &args);
}

te_status te_swig_quantize(te_context *ctx, const te_tensor *x, te_tensor *out,
                           const te_tensor *out_t, const float *scale, float *amax,
                           double amax_epsilon, int power_of_2_scales, int transpose) {
  te_quantize_options o;
  te_quantize_options_init(&o);
  o.scale = scale;
  o.amax = amax;
  o.amax_epsilon = (float)amax_epsilon;
  o.power_of_2_scales = power_of_2_scales ? 1 : 0;
  if (transpose) return te_cast_transpose(ctx, x, out, (te_tensor *)out_t, &o);
  return te_quantize(ctx, x, out, &o);
}

te_status te_swig_gemm(te_context *ctx, const te_tensor *a, const te_tensor *b, te_tensor *d,
                       int transa, int transb, int epilogue, const te_tensor *gemm_bias,
                       te_tensor *gemm_gelu_input, int accumulate, int use_split_accumulator) {
  te_gemm_options o;
  te_gemm_options_init(&o);
  o.transa = transa ? 1 : 0;
  o.transb = transb ? 1 : 0;
  o.epilogue = (te_epilogue)epilogue;
  o.bias = gemm_bias;
  o.gelu_input = gemm_gelu_input;
  o.accumulate = accumulate ? 1 : 0;
  o.use_split_accumulator = use_split_accumulator ? 1 : 0;
  return te_gemm(ctx, a, b, d, &o);
}

/* te_norm_forward with its options and arguments built here; quantize = 0 passes NULL for
 * args->quantize (scale, amax, amax_epsilon and power_of_2_scales are then unused). */
te_status te_swig_norm_forward(te_context *ctx, int kind, double eps, int zero_centered_gamma,
                               const te_tensor *x, const te_tensor *norm_gamma,
                               const te_tensor *norm_beta, te_tensor *norm_out,
                               te_tensor *norm_out_t, te_tensor *norm_mu, te_tensor *norm_rsigma,
                               int quantize, const float *scale, float *amax,
                               double amax_epsilon, int power_of_2_scales) {
  te_norm_options o;
  te_norm_forward_args args;
  te_quantize_options q;
  te_norm_options_init(&o);
  o.kind = (te_norm_kind)kind;
  o.eps = (float)eps;
  o.zero_centered_gamma = zero_centered_gamma;
  te_norm_forward_args_init(&args);
  args.input = x;
  args.weight = norm_gamma;
  args.bias = norm_beta;
  args.output = norm_out;
  args.output_t = norm_out_t;
  args.mu = norm_mu;
  args.rsigma = norm_rsigma;
  if (quantize) {
    te_quantize_options_init(&q);
    q.scale = scale;
    q.amax = amax;
    q.amax_epsilon = (float)amax_epsilon;
    q.power_of_2_scales = power_of_2_scales;
    args.quantize = &q;
  }
  return te_norm_forward(ctx, &o, &args);
}

te_status te_swig_norm_backward(te_context *ctx, int kind, double eps, int zero_centered_gamma,
                                const te_tensor *dy, const te_tensor *x,
                                const te_tensor *norm_gamma, const te_tensor *norm_mu,
                                const te_tensor *norm_rsigma, te_tensor *grad_x, te_tensor *dgamma,
                                te_tensor *dbeta) {
  te_norm_options o;
  te_norm_options_init(&o);
  o.kind = (te_norm_kind)kind;
  o.eps = (float)eps;
  o.zero_centered_gamma = zero_centered_gamma;
  return te_norm_backward(ctx, &o, dy, x, norm_gamma, norm_mu, norm_rsigma, grad_x, dgamma, dbeta);
}

/* ---- the transformer modules: arguments and gradients as positional tensors -------------------- */

static void te_swig_layernorm_linear_args(te_layernorm_linear_forward_args *a, const te_tensor *x,
                                          const te_tensor *norm_gamma, const te_tensor *norm_beta,
                                          const te_tensor *w, const te_tensor *b,
                                          int weight_unchanged, te_tensor *norm_out) {
  te_layernorm_linear_forward_args_init(a);
  a->input = x;
  a->ln_weight = norm_gamma;
  a->ln_bias = norm_beta;
  a->weight = w;
  a->bias = b;
  a->weight_unchanged = weight_unchanged ? 1 : 0;
  a->ln_out = norm_out;
}

te_status te_swig_layernorm_linear_forward_compute(te_context *ctx, te_layernorm_linear *m,
                                                   const te_tensor *x, const te_tensor *norm_gamma,
                                                   const te_tensor *norm_beta, const te_tensor *w,
                                                   const te_tensor *b, int weight_unchanged,
                                                   te_tensor *norm_out, te_tensor *y,
                                                   te_layernorm_linear_residuals *residuals) {
  te_layernorm_linear_forward_args a;
  te_swig_layernorm_linear_args(&a, x, norm_gamma, norm_beta, w, b, weight_unchanged, norm_out);
  return te_layernorm_linear_forward_compute(ctx, m, &a, y, residuals);
}

te_status te_swig_layernorm_linear_forward(te_context *ctx, te_layernorm_linear *m,
                                           const te_tensor *x, const te_tensor *norm_gamma,
                                           const te_tensor *norm_beta, const te_tensor *w,
                                           const te_tensor *b, int weight_unchanged,
                                           te_tensor *norm_out, te_tensor *y,
                                           te_layernorm_linear_backward_ctx **out) {
  te_layernorm_linear_forward_args a;
  te_swig_layernorm_linear_args(&a, x, norm_gamma, norm_beta, w, b, weight_unchanged, norm_out);
  return te_layernorm_linear_forward(ctx, m, &a, y, out);
}

te_status te_swig_layernorm_linear_backward(te_context *ctx, te_layernorm_linear_backward_ctx *bwd,
                                            const te_tensor *dy, te_tensor *grad_x,
                                            te_tensor *grad_gamma, te_tensor *grad_beta,
                                            te_tensor *grad_w, te_tensor *grad_b, int once) {
  te_layernorm_linear_grads g;
  te_linear_backward_args args;
  te_layernorm_linear_grads_init(&g);
  g.dx = grad_x;
  g.dln_weight = grad_gamma;
  g.dln_bias = grad_beta;
  g.dw = grad_w;
  g.db = grad_b;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_layernorm_linear_backward(ctx, bwd, dy, &g, &args);
}

PyObject *te_swig_layernorm_linear_residuals_tensors(const te_layernorm_linear_residuals *r) {
  return Py_BuildValue("(NNNNN)", te_swig_tensor_to_tuple(&r->ln_out_t),
                       te_swig_tensor_to_tuple(&r->weight_t), te_swig_tensor_to_tuple(&r->mu),
                       te_swig_tensor_to_tuple(&r->rsigma), PyBool_FromLong(r->fp8));
}

static void te_swig_layernorm_mlp_args(te_layernorm_mlp_forward_args *a, const te_tensor *x,
                                       const te_tensor *norm_gamma, const te_tensor *norm_beta,
                                       const te_tensor *w1, const te_tensor *b1,
                                       const te_tensor *w2, const te_tensor *b2,
                                       int weight_unchanged, te_tensor *norm_out) {
  te_layernorm_mlp_forward_args_init(a);
  a->input = x;
  a->ln_weight = norm_gamma;
  a->ln_bias = norm_beta;
  a->fc1_weight = w1;
  a->fc1_bias = b1;
  a->fc2_weight = w2;
  a->fc2_bias = b2;
  a->weight_unchanged = weight_unchanged ? 1 : 0;
  a->ln_out = norm_out;
}

te_status te_swig_layernorm_mlp_forward_compute(te_context *ctx, te_layernorm_mlp *m,
                                                const te_tensor *x, const te_tensor *norm_gamma,
                                                const te_tensor *norm_beta, const te_tensor *w1,
                                                const te_tensor *b1, const te_tensor *w2,
                                                const te_tensor *b2, int weight_unchanged,
                                                te_tensor *norm_out, te_tensor *y,
                                                te_layernorm_mlp_residuals *residuals) {
  te_layernorm_mlp_forward_args a;
  te_swig_layernorm_mlp_args(&a, x, norm_gamma, norm_beta, w1, b1, w2, b2, weight_unchanged, norm_out);
  return te_layernorm_mlp_forward_compute(ctx, m, &a, y, residuals);
}

te_status te_swig_layernorm_mlp_forward(te_context *ctx, te_layernorm_mlp *m, const te_tensor *x,
                                        const te_tensor *norm_gamma, const te_tensor *norm_beta,
                                        const te_tensor *w1, const te_tensor *b1,
                                        const te_tensor *w2, const te_tensor *b2,
                                        int weight_unchanged, te_tensor *norm_out, te_tensor *y,
                                        te_layernorm_mlp_backward_ctx **out) {
  te_layernorm_mlp_forward_args a;
  te_swig_layernorm_mlp_args(&a, x, norm_gamma, norm_beta, w1, b1, w2, b2, weight_unchanged, norm_out);
  return te_layernorm_mlp_forward(ctx, m, &a, y, out);
}

te_status te_swig_layernorm_mlp_backward(te_context *ctx, te_layernorm_mlp_backward_ctx *bwd,
                                         const te_tensor *dy, te_tensor *grad_x,
                                         te_tensor *grad_gamma, te_tensor *grad_beta,
                                         te_tensor *grad_w1, te_tensor *grad_b1,
                                         te_tensor *grad_w2, te_tensor *grad_b2, int once) {
  te_layernorm_mlp_grads g;
  te_linear_backward_args args;
  te_layernorm_mlp_grads_init(&g);
  g.dx = grad_x;
  g.dln_weight = grad_gamma;
  g.dln_bias = grad_beta;
  g.dfc1_weight = grad_w1;
  g.dfc1_bias = grad_b1;
  g.dfc2_weight = grad_w2;
  g.dfc2_bias = grad_b2;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_layernorm_mlp_backward(ctx, bwd, dy, &g, &args);
}

PyObject *te_swig_layernorm_mlp_residuals_tensors(const te_layernorm_mlp_residuals *r) {
  return Py_BuildValue("(NNNNNNNN)", te_swig_tensor_to_tuple(&r->ln_out_t),
                       te_swig_tensor_to_tuple(&r->fc1_weight_t), te_swig_tensor_to_tuple(&r->fc1_out),
                       te_swig_tensor_to_tuple(&r->act_out_t), te_swig_tensor_to_tuple(&r->fc2_weight_t),
                       te_swig_tensor_to_tuple(&r->mu), te_swig_tensor_to_tuple(&r->rsigma),
                       PyBool_FromLong(r->fp8));
}

/* Residuals in the caller's memory (residuals: an address, int). */
te_status te_swig_layernorm_linear_residuals_size(te_context *ctx, const te_layernorm_linear *m,
                                                  const te_tensor *x, const te_tensor *norm_gamma,
                                                  const te_tensor *norm_beta, const te_tensor *w,
                                                  const te_tensor *b, size_t *size) {
  te_layernorm_linear_forward_args a;
  te_swig_layernorm_linear_args(&a, x, norm_gamma, norm_beta, w, b, 0, NULL);
  return te_layernorm_linear_residuals_size(ctx, m, &a, size);
}

te_status te_swig_layernorm_linear_forward_compute_into(
    te_context *ctx, te_layernorm_linear *m, const te_tensor *x, const te_tensor *norm_gamma,
    const te_tensor *norm_beta, const te_tensor *w, const te_tensor *b, int weight_unchanged,
    te_tensor *y, void *residuals, size_t residuals_bytes) {
  te_layernorm_linear_forward_args a;
  te_swig_layernorm_linear_args(&a, x, norm_gamma, norm_beta, w, b, weight_unchanged, NULL);
  return te_layernorm_linear_forward_compute_into(ctx, m, &a, y, residuals, residuals_bytes);
}

te_status te_swig_layernorm_linear_backward_from(
    te_context *ctx, te_layernorm_linear *m, const te_tensor *x, const te_tensor *norm_gamma,
    const te_tensor *norm_beta, const te_tensor *w, const te_tensor *b, const void *residuals,
    size_t residuals_bytes, const te_tensor *dy, te_tensor *grad_x, te_tensor *grad_gamma,
    te_tensor *grad_beta, te_tensor *grad_w, te_tensor *grad_b, int once) {
  te_layernorm_linear_forward_args a;
  te_layernorm_linear_grads g;
  te_linear_backward_args args;
  te_swig_layernorm_linear_args(&a, x, norm_gamma, norm_beta, w, b, 0, NULL);
  te_layernorm_linear_grads_init(&g);
  g.dx = grad_x;
  g.dln_weight = grad_gamma;
  g.dln_bias = grad_beta;
  g.dw = grad_w;
  g.db = grad_b;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_layernorm_linear_backward_from(ctx, m, &a, residuals, residuals_bytes, dy, &g, &args);
}

te_status te_swig_layernorm_mlp_residuals_size(te_context *ctx, const te_layernorm_mlp *m,
                                               const te_tensor *x, const te_tensor *norm_gamma,
                                               const te_tensor *norm_beta, const te_tensor *w1,
                                               const te_tensor *b1, const te_tensor *w2,
                                               const te_tensor *b2, size_t *size) {
  te_layernorm_mlp_forward_args a;
  te_swig_layernorm_mlp_args(&a, x, norm_gamma, norm_beta, w1, b1, w2, b2, 0, NULL);
  return te_layernorm_mlp_residuals_size(ctx, m, &a, size);
}

te_status te_swig_layernorm_mlp_forward_compute_into(
    te_context *ctx, te_layernorm_mlp *m, const te_tensor *x, const te_tensor *norm_gamma,
    const te_tensor *norm_beta, const te_tensor *w1, const te_tensor *b1, const te_tensor *w2,
    const te_tensor *b2, int weight_unchanged, te_tensor *y, void *residuals,
    size_t residuals_bytes) {
  te_layernorm_mlp_forward_args a;
  te_swig_layernorm_mlp_args(&a, x, norm_gamma, norm_beta, w1, b1, w2, b2, weight_unchanged, NULL);
  return te_layernorm_mlp_forward_compute_into(ctx, m, &a, y, residuals, residuals_bytes);
}

te_status te_swig_layernorm_mlp_backward_from(
    te_context *ctx, te_layernorm_mlp *m, const te_tensor *x, const te_tensor *norm_gamma,
    const te_tensor *norm_beta, const te_tensor *w1, const te_tensor *b1, const te_tensor *w2,
    const te_tensor *b2, const void *residuals, size_t residuals_bytes, const te_tensor *dy,
    te_tensor *grad_x, te_tensor *grad_gamma, te_tensor *grad_beta, te_tensor *grad_w1,
    te_tensor *grad_b1, te_tensor *grad_w2, te_tensor *grad_b2, int once) {
  te_layernorm_mlp_forward_args a;
  te_layernorm_mlp_grads g;
  te_linear_backward_args args;
  te_swig_layernorm_mlp_args(&a, x, norm_gamma, norm_beta, w1, b1, w2, b2, 0, NULL);
  te_layernorm_mlp_grads_init(&g);
  g.dx = grad_x;
  g.dln_weight = grad_gamma;
  g.dln_bias = grad_beta;
  g.dfc1_weight = grad_w1;
  g.dfc1_bias = grad_b1;
  g.dfc2_weight = grad_w2;
  g.dfc2_bias = grad_b2;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_layernorm_mlp_backward_from(ctx, m, &a, residuals, residuals_bytes, dy, &g, &args);
}

/* GroupedLinear: m_splits, weights and biases are lists (see the typemaps above). */
#ifndef TE_SWIG_WITHOUT_GROUPED_LINEAR
te_status te_swig_grouped_linear_forward_compute(te_context *ctx, te_grouped_linear *g,
                                                 const te_tensor *x, const int64_t *m_splits,
                                                 const te_tensor *const *weight_list,
                                                 const te_tensor *const *bias_list,
                                                 int weight_unchanged, te_tensor *y,
                                                 te_grouped_linear_residuals *residuals) {
  te_grouped_linear_forward_args a;
  te_grouped_linear_forward_args_init(&a);
  a.input = x;
  a.m_splits = m_splits;
  a.weights = weight_list;
  a.biases = bias_list;
  a.weight_unchanged = weight_unchanged ? 1 : 0;
  return te_grouped_linear_forward_compute(ctx, g, &a, y, residuals);
}

te_status te_swig_grouped_linear_forward(te_context *ctx, te_grouped_linear *g, const te_tensor *x,
                                         const int64_t *m_splits, const te_tensor *const *weight_list,
                                         const te_tensor *const *bias_list, int weight_unchanged,
                                         te_tensor *y, te_grouped_linear_backward_ctx **out) {
  te_grouped_linear_forward_args a;
  te_grouped_linear_forward_args_init(&a);
  a.input = x;
  a.m_splits = m_splits;
  a.weights = weight_list;
  a.biases = bias_list;
  a.weight_unchanged = weight_unchanged ? 1 : 0;
  return te_grouped_linear_forward(ctx, g, &a, y, out);
}

/* Residuals in the caller's memory; with_inputs = 0: inputs NULL (after an FP8 forward). */
te_status te_swig_grouped_linear_residuals_size(te_context *ctx, const te_grouped_linear *g,
                                                const te_tensor *x, const int64_t *m_splits,
                                                const te_tensor *const *weight_list,
                                                const te_tensor *const *bias_list, size_t *size) {
  te_grouped_linear_forward_args a;
  te_grouped_linear_forward_args_init(&a);
  a.input = x;
  a.m_splits = m_splits;
  a.weights = weight_list;
  a.biases = bias_list;
  return te_grouped_linear_residuals_size(ctx, g, &a, size);
}

te_status te_swig_grouped_linear_forward_compute_into(
    te_context *ctx, te_grouped_linear *g, const te_tensor *x, const int64_t *m_splits,
    const te_tensor *const *weight_list, const te_tensor *const *bias_list, int weight_unchanged,
    te_tensor *y, void *residuals, size_t residuals_bytes) {
  te_grouped_linear_forward_args a;
  te_grouped_linear_forward_args_init(&a);
  a.input = x;
  a.m_splits = m_splits;
  a.weights = weight_list;
  a.biases = bias_list;
  a.weight_unchanged = weight_unchanged ? 1 : 0;
  return te_grouped_linear_forward_compute_into(ctx, g, &a, y, residuals, residuals_bytes);
}

te_status te_swig_grouped_linear_backward_from(
    te_context *ctx, te_grouped_linear *g, int with_inputs, const te_tensor *x,
    const int64_t *m_splits, const te_tensor *const *weight_list,
    const te_tensor *const *bias_list, const void *residuals, size_t residuals_bytes,
    const te_tensor *dy, te_tensor *grad_x, te_tensor *const *grad_ws, te_tensor *const *grad_bs,
    int once) {
  te_grouped_linear_forward_args a;
  te_linear_backward_args args;
  te_grouped_linear_forward_args_init(&a);
  a.input = x;
  a.m_splits = m_splits;
  a.weights = weight_list;
  a.biases = bias_list;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_grouped_linear_backward_from(ctx, g, with_inputs ? &a : NULL, residuals,
                                         residuals_bytes, dy, grad_x, grad_ws, grad_bs, &args);
}

te_status te_swig_grouped_linear_backward(te_context *ctx, te_grouped_linear_backward_ctx *bwd,
                                          const te_tensor *dy, te_tensor *grad_x,
                                          te_tensor *const *grad_ws, te_tensor *const *grad_bs,
                                          int once) {
  te_linear_backward_args args;
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_grouped_linear_backward(ctx, bwd, dy, grad_x, grad_ws, grad_bs, &args);
}
#endif
/* Attention and RoPE: q, k, v, the offsets and the gradients as positional tensors; max_seqlen_*
 * 0 for BSHD. Residuals in the caller's memory: residuals is an address (int). */
#ifndef TE_SWIG_WITHOUT_ATTENTION
static void te_swig_attention_args(te_attention_forward_args *a, const te_tensor *attn_q,
                                   const te_tensor *attn_k, const te_tensor *attn_v,
                                   const te_tensor *offsets_q, const te_tensor *offsets_kv,
                                   int64_t max_seqlen_q, int64_t max_seqlen_kv) {
  te_attention_forward_args_init(a);
  a->q = attn_q;
  a->k = attn_k;
  a->v = attn_v;
  a->cu_seqlens_q = offsets_q;
  a->cu_seqlens_kv = offsets_kv;
  a->max_seqlen_q = max_seqlen_q;
  a->max_seqlen_kv = max_seqlen_kv;
}

static void te_swig_attention_grads(te_attention_grads *g, te_tensor *grad_q, te_tensor *grad_k,
                                    te_tensor *grad_v) {
  te_attention_grads_init(g);
  g->dq = grad_q;
  g->dk = grad_k;
  g->dv = grad_v;
}

te_status te_swig_attention_forward_compute(te_context *ctx, te_attention *m,
                                            const te_tensor *attn_q, const te_tensor *attn_k,
                                            const te_tensor *attn_v, const te_tensor *offsets_q,
                                            const te_tensor *offsets_kv, int64_t max_seqlen_q,
                                            int64_t max_seqlen_kv, te_tensor *o,
                                            te_attention_residuals *residuals) {
  te_attention_forward_args a;
  te_swig_attention_args(&a, attn_q, attn_k, attn_v, offsets_q, offsets_kv, max_seqlen_q, max_seqlen_kv);
  return te_attention_forward_compute(ctx, m, &a, o, residuals);
}

te_status te_swig_attention_forward(te_context *ctx, te_attention *m, const te_tensor *attn_q,
                                    const te_tensor *attn_k, const te_tensor *attn_v,
                                    const te_tensor *offsets_q, const te_tensor *offsets_kv,
                                    int64_t max_seqlen_q, int64_t max_seqlen_kv, te_tensor *o,
                                    te_attention_backward_ctx **out) {
  te_attention_forward_args a;
  te_swig_attention_args(&a, attn_q, attn_k, attn_v, offsets_q, offsets_kv, max_seqlen_q, max_seqlen_kv);
  return te_attention_forward(ctx, m, &a, o, out);
}

te_status te_swig_attention_backward(te_context *ctx, te_attention_backward_ctx *bwd,
                                     const te_tensor *d_o, te_tensor *grad_q, te_tensor *grad_k,
                                     te_tensor *grad_v, int once) {
  te_attention_grads g;
  te_linear_backward_args args;
  te_swig_attention_grads(&g, grad_q, grad_k, grad_v);
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_attention_backward(ctx, bwd, d_o, &g, &args);
}

PyObject *te_swig_attention_residuals_tensors(const te_attention_residuals *r) {
  return Py_BuildValue("(NNNNNN)", te_swig_tensor_to_tuple(&r->q), te_swig_tensor_to_tuple(&r->k),
                       te_swig_tensor_to_tuple(&r->v), te_swig_tensor_to_tuple(&r->o),
                       te_swig_tensor_to_tuple(&r->lse), PyBool_FromLong(r->fp8));
}

te_status te_swig_attention_residuals_size(te_context *ctx, const te_attention *m,
                                           const te_tensor *attn_q, const te_tensor *attn_k,
                                           const te_tensor *attn_v, const te_tensor *offsets_q,
                                           const te_tensor *offsets_kv, int64_t max_seqlen_q,
                                           int64_t max_seqlen_kv, size_t *size) {
  te_attention_forward_args a;
  te_swig_attention_args(&a, attn_q, attn_k, attn_v, offsets_q, offsets_kv, max_seqlen_q, max_seqlen_kv);
  return te_attention_residuals_size(ctx, m, &a, size);
}

te_status te_swig_attention_forward_compute_into(
    te_context *ctx, te_attention *m, const te_tensor *attn_q, const te_tensor *attn_k,
    const te_tensor *attn_v, const te_tensor *offsets_q, const te_tensor *offsets_kv,
    int64_t max_seqlen_q, int64_t max_seqlen_kv, te_tensor *o, void *residuals,
    size_t residuals_bytes) {
  te_attention_forward_args a;
  te_swig_attention_args(&a, attn_q, attn_k, attn_v, offsets_q, offsets_kv, max_seqlen_q, max_seqlen_kv);
  return te_attention_forward_compute_into(ctx, m, &a, o, residuals, residuals_bytes);
}

te_status te_swig_attention_backward_from(
    te_context *ctx, te_attention *m, const te_tensor *attn_q, const te_tensor *attn_k,
    const te_tensor *attn_v, const te_tensor *offsets_q, const te_tensor *offsets_kv,
    int64_t max_seqlen_q, int64_t max_seqlen_kv, const te_tensor *o, const void *residuals,
    size_t residuals_bytes, const te_tensor *d_o, te_tensor *grad_q, te_tensor *grad_k,
    te_tensor *grad_v, int once) {
  te_attention_forward_args a;
  te_attention_grads g;
  te_linear_backward_args args;
  te_swig_attention_args(&a, attn_q, attn_k, attn_v, offsets_q, offsets_kv, max_seqlen_q, max_seqlen_kv);
  te_swig_attention_grads(&g, grad_q, grad_k, grad_v);
  te_linear_backward_args_init(&args);
  args.flags = once ? TE_BACKWARD_ONCE : 0u;
  return te_attention_backward_from(ctx, m, &a, o, residuals, residuals_bytes, d_o, &g, &args);
}

te_status te_swig_rope(te_context *ctx, int rot_dim, int interleaved, const te_tensor *rope_in,
                       const te_tensor *freqs, const te_tensor *cu_seqlens, te_tensor *rope_out,
                       int backward) {
  te_rope_options o;
  te_rope_options_init(&o);
  o.rot_dim = rot_dim;
  o.interleaved = interleaved ? 1 : 0;
  if (backward) return te_rope_backward(ctx, &o, rope_in, freqs, cu_seqlens, rope_out);
  return te_rope_forward(ctx, &o, rope_in, freqs, cu_seqlens, rope_out);
}
#endif
%}

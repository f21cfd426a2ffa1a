// The traced call of a torch layer module, compiled (mlms_nb/frameworks/torch/native.py builds it, tracing.py's
// LayerHooks uses it where it could be built). It does what LayerHooks._direct's Python call does, with one
// difference that matters: the tensors' sizes and item sizes are read from the ATen tensor, not through torch's
// Python getters. Lite0 at batch 1, paired calls: `tensor.shape` (a new torch.Size per read) cost about 0.6% of the
// forward per read in place, the Python call +3.5% all told, this one +0.6%.
//
// A call of one positional argument, while no module or global hook is registered, torch.jit is not tracing and the
// module's forward is still the traced one: clock, forward, clock, then (part, start_ns, end_ns) appended to
// `calls`, the part handed on from the previous call while the sizes, item sizes and aliasing are equal (the Python
// call's records, PART_FIELDS in tracing.py). Anything else goes to `call_impl` (torch's path, where the wrapped
// forward records), and a call whose tensors are not plain dense tensors of at most 8 dimensions is recorded by
// `other(number, input, output, start_ns, end_ns)`, the Python side's general record.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstddef>
#include <ctime>

namespace {

constexpr int kMaxDims = 8;
constexpr int kHooks = 8;

struct LayerCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* forward;
  PyObject* number;
  PyObject* calls;
  PyObject* module_dict;
  PyObject* traced;
  PyObject* call_impl;
  PyObject* tracing_state;
  PyObject* other;
  PyObject* hooks[kHooks];
  PyObject* part;  // the last call's part, or nullptr
  PyObject* weakreflist;
  int64_t in_dims[kMaxDims];
  int64_t out_dims[kMaxDims];
  int64_t in_itemsize;
  int64_t out_itemsize;
  int in_ndim;
  int out_ndim;
  int alias;
};

PyObject* forward_name = nullptr;

// time.perf_counter_ns's clock on Linux (CPython reads CLOCK_MONOTONIC), so the spans sit on the tracer's clock
inline long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// a dense tensor of known sizes, at most kMaxDims of them: its sizes can be read here
bool plain(const at::Tensor& t) {
  return !t.is_nested() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && t.dim() <= kMaxDims;
}

PyObject* sizes_tuple(c10::IntArrayRef sizes) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t k = 0; k < sizes.size(); ++k) {
    PyObject* v = PyLong_FromLongLong(sizes[k]);
    if (v == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(k), v);
  }
  return tuple;
}

// the part of this call (a new one when anything differs from the last call's); 0 on success
int update_part(LayerCall* self, const at::Tensor& in, const at::Tensor& out, int alias) {
  c10::IntArrayRef si = in.sizes(), so = out.sizes();
  const int ni = static_cast<int>(si.size()), no = static_cast<int>(so.size());
  const int64_t ii = static_cast<int64_t>(in.itemsize()), io = static_cast<int64_t>(out.itemsize());
  bool same = self->part != nullptr && ni == self->in_ndim && no == self->out_ndim && ii == self->in_itemsize &&
              io == self->out_itemsize && alias == self->alias;
  for (int k = 0; same && k < ni; ++k) same = si[k] == self->in_dims[k];
  for (int k = 0; same && k < no; ++k) same = so[k] == self->out_dims[k];
  if (same) return 0;
  PyObject* in_shape = sizes_tuple(si);
  PyObject* out_shape = in_shape ? sizes_tuple(so) : nullptr;
  PyObject* in_size = out_shape ? PyLong_FromLongLong(ii) : nullptr;
  PyObject* out_size = in_size ? PyLong_FromLongLong(io) : nullptr;
  PyObject* part = out_size ? PyTuple_Pack(6, self->number, in_shape, in_size, out_shape, out_size,
                                           alias ? Py_True : Py_False)
                            : nullptr;
  Py_XDECREF(in_shape);
  Py_XDECREF(out_shape);
  Py_XDECREF(in_size);
  Py_XDECREF(out_size);
  if (part == nullptr) return -1;
  Py_XSETREF(self->part, part);
  self->in_ndim = ni;
  self->out_ndim = no;
  self->in_itemsize = ii;
  self->out_itemsize = io;
  self->alias = alias;
  for (int k = 0; k < ni; ++k) self->in_dims[k] = si[k];
  for (int k = 0; k < no; ++k) self->out_dims[k] = so[k];
  return 0;
}

int record(LayerCall* self, PyObject* input, PyObject* output, long long t0, long long t1) {
  if (THPVariable_CheckExact(input) && THPVariable_CheckExact(output)) {
    const at::Tensor& in = THPVariable_Unpack(input);
    const at::Tensor& out = THPVariable_Unpack(output);
    bool readable = false;
    try {
      readable = plain(in) && plain(out);
    } catch (...) {
      readable = false;
    }
    if (readable) {
      if (update_part(self, in, out, output == input) < 0) return -1;
      // held here: an allocation below may run a collection, and through it another thread calling this layer
      // may set its own part meanwhile (and drop this one)
      PyObject* part = Py_NewRef(self->part);
      PyObject* start = PyLong_FromLongLong(t0);
      PyObject* end = start ? PyLong_FromLongLong(t1) : nullptr;
      PyObject* call = end ? PyTuple_Pack(3, part, start, end) : nullptr;
      Py_DECREF(part);
      Py_XDECREF(start);
      Py_XDECREF(end);
      if (call == nullptr) return -1;
      int rc = PyList_Append(self->calls, call);
      Py_DECREF(call);
      return rc;
    }
  }
  PyObject* done = PyObject_CallFunction(self->other, "OOOLL", self->number, input, output, t0, t1);
  if (done == nullptr) return -1;
  Py_DECREF(done);
  return 0;
}

PyObject* layer_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  LayerCall* self = reinterpret_cast<LayerCall*>(callable);
  bool slow = PyVectorcall_NARGS(nargsf) != 1 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0);
  for (int k = 0; !slow && k < kHooks; ++k) slow = PyDict_GET_SIZE(self->hooks[k]) != 0;
  if (!slow) {
    PyObject* forward = PyDict_GetItemWithError(self->module_dict, forward_name);  // borrowed
    if (forward == nullptr && PyErr_Occurred()) return nullptr;
    slow = forward != self->traced;
  }
  if (!slow) {
    PyObject* state = PyObject_CallNoArgs(self->tracing_state);
    if (state == nullptr) return nullptr;
    slow = state != Py_None;
    Py_DECREF(state);
  }
  if (slow) return PyObject_Vectorcall(self->call_impl, args, nargsf, kwnames);
  PyObject* input = args[0];
  const long long t0 = now_ns();
  PyObject* output = PyObject_Vectorcall(self->forward, args, 1, nullptr);
  const long long t1 = now_ns();
  if (output == nullptr) return nullptr;
  if (record(self, input, output, t0, t1) < 0) {
    Py_DECREF(output);
    return nullptr;
  }
  return output;
}

int layer_call_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  LayerCall* self = reinterpret_cast<LayerCall*>(obj);
  PyObject *forward, *number, *calls, *module_dict, *traced, *call_impl, *tracing_state, *other, *hooks;
  if (self->vectorcall != nullptr) {
    PyErr_SetString(PyExc_TypeError, "LayerCall is set up once");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "OOO!O!OOOOO!:LayerCall", &forward, &number, &PyList_Type, &calls, &PyDict_Type,
                        &module_dict, &traced, &call_impl, &tracing_state, &other, &PyTuple_Type, &hooks))
    return -1;
  if (PyTuple_GET_SIZE(hooks) != kHooks) {
    PyErr_SetString(PyExc_ValueError, "LayerCall needs the 8 hook tables _call_impl checks");
    return -1;
  }
  for (int k = 0; k < kHooks; ++k) {
    if (!PyDict_Check(PyTuple_GET_ITEM(hooks, k))) {
      PyErr_SetString(PyExc_TypeError, "LayerCall's hook tables must be dicts");
      return -1;
    }
  }
  self->forward = Py_NewRef(forward);
  self->number = Py_NewRef(number);
  self->calls = Py_NewRef(calls);
  self->module_dict = Py_NewRef(module_dict);
  self->traced = Py_NewRef(traced);
  self->call_impl = Py_NewRef(call_impl);
  self->tracing_state = Py_NewRef(tracing_state);
  self->other = Py_NewRef(other);
  for (int k = 0; k < kHooks; ++k) self->hooks[k] = Py_NewRef(PyTuple_GET_ITEM(hooks, k));
  self->part = nullptr;
  self->vectorcall = layer_call;
  return 0;
}

int layer_call_traverse(PyObject* obj, visitproc visit, void* arg) {
  LayerCall* self = reinterpret_cast<LayerCall*>(obj);
  Py_VISIT(self->forward);
  Py_VISIT(self->calls);
  Py_VISIT(self->module_dict);
  Py_VISIT(self->traced);
  Py_VISIT(self->call_impl);
  Py_VISIT(self->other);
  for (int k = 0; k < kHooks; ++k) Py_VISIT(self->hooks[k]);
  return 0;
}

int layer_call_clear(PyObject* obj) {
  LayerCall* self = reinterpret_cast<LayerCall*>(obj);
  Py_CLEAR(self->forward);
  Py_CLEAR(self->number);
  Py_CLEAR(self->calls);
  Py_CLEAR(self->module_dict);
  Py_CLEAR(self->traced);
  Py_CLEAR(self->call_impl);
  Py_CLEAR(self->tracing_state);
  Py_CLEAR(self->other);
  for (int k = 0; k < kHooks; ++k) Py_CLEAR(self->hooks[k]);
  Py_CLEAR(self->part);
  return 0;
}

void layer_call_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  LayerCall* self = reinterpret_cast<LayerCall*>(obj);
  if (self->weakreflist != nullptr) PyObject_ClearWeakRefs(obj);
  layer_call_clear(obj);
  Py_TYPE(obj)->tp_free(obj);
}

PyTypeObject LayerCallType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_recorder", "The traced call of a torch layer, compiled.", -1,
                          nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__recorder(void) {
  LayerCallType.tp_name = "mlms_nb.frameworks.torch._recorder.LayerCall";
  LayerCallType.tp_doc = "LayerCall(forward, number, calls, module_dict, traced, call_impl, tracing_state, other, "
                         "hooks): a layer module's traced call (see _recorder.cpp)";
  LayerCallType.tp_basicsize = sizeof(LayerCall);
  LayerCallType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  LayerCallType.tp_vectorcall_offset = offsetof(LayerCall, vectorcall);
  LayerCallType.tp_call = PyVectorcall_Call;
  LayerCallType.tp_weaklistoffset = offsetof(LayerCall, weakreflist);
  LayerCallType.tp_new = PyType_GenericNew;
  LayerCallType.tp_init = layer_call_init;
  LayerCallType.tp_traverse = layer_call_traverse;
  LayerCallType.tp_clear = layer_call_clear;
  LayerCallType.tp_dealloc = layer_call_dealloc;
  if (PyType_Ready(&LayerCallType) < 0) return nullptr;
  forward_name = PyUnicode_InternFromString("forward");
  if (forward_name == nullptr) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  Py_INCREF(&LayerCallType);
  if (PyModule_AddObject(module, "LayerCall", reinterpret_cast<PyObject*>(&LayerCallType)) < 0) {
    Py_DECREF(&LayerCallType);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}

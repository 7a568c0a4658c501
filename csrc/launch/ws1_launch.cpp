// The step ops of profile triton_cuda_bf16 (torch.ops.ws1_triton.*) with their host path in C++.
//
// Why: an op call at M = 1 launches a kernel of about 10 us, and the Python path spent about 20 us of host time
// before it (the dispatcher into Python, the output's allocation, the tile and plan lookups, Triton's launcher
// parsing the arguments and asking the driver about each pointer). Here the CUDA kernel of each step op is C++: it
// keys the call by everything the Python path could pick its kernels by (each tensor's device, dtype, sizes,
// strides and 16-byte alignment; each float's bits), finds the recipe that Python recorded for that key, allocates
// the output and the call's scratch buffers with at::empty and calls cuLaunchKernel with the same compiled Triton
// kernels, grids, blocks, shared memory and arguments (a declared constant, such as rope's inverse-frequency table,
// is passed from the reference the recipe keeps). The bits cannot differ from the Python path: it is the same
// launch.
//
// A miss (or a key Python marked as not replayable) redispatches to the op's Python twin (ws1_triton::<op>_py).
// With a recipe pending for this thread, the twin records its launches (triton_ops/native.py) and registers them:
// add_launch per kernel, then commit. commit checks each launch's parameter list against the compiled kernel's own
// (cuFuncGetParamInfo: count and sizes), so a recipe that disagrees with the kernel is stored as Python-only,
// never launched. While any launch log is open (ws1_kernels.launches.observe, in any thread: the list of open logs is
// handed over by native.enable() and read here under the GIL) every call takes the Python path, so the harness's
// observations always see the Python path's records and Triton's launch hooks.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using at::Tensor;

// ------------------------------------------------------------------------------------------- the driver

using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
using ParamInfoFn = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
using ErrorStringFn = CUresult (*)(CUresult, const char**);

struct Driver {
  LaunchFn launch = nullptr;
  ParamInfoFn param_info = nullptr;  // CUDA 12.4+ drivers; without it no recipe is accepted
  ErrorStringFn error_string = nullptr;
};

// The driver's entry points by dlopen, as Triton's own launcher finds them: the module links no libcuda, so it
// loads on a machine without a GPU (and CI can import-check it).
const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return out;
    out.launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
    out.param_info = reinterpret_cast<ParamInfoFn>(dlsym(lib, "cuFuncGetParamInfo"));
    out.error_string = reinterpret_cast<ErrorStringFn>(dlsym(lib, "cuGetErrorString"));
    return out;
  }();
  return d;
}

std::string cu_error(CUresult rc) {
  const char* text = nullptr;
  if (driver().error_string != nullptr) driver().error_string(rc, &text);
  return text != nullptr ? std::string(text) : "CUresult " + std::to_string(static_cast<int>(rc));
}

// ------------------------------------------------------------------------------------------- recipes

// Kinds of a kernel parameter; the numbers are the Python side's (triton_ops/native.py, KIND_*).
enum Kind : int64_t { kInput = 0, kOutput = 1, kI32 = 2, kI64 = 3, kF32 = 4, kNull = 5, kScratch = 6, kConst = 7 };

struct Param {
  Kind kind;
  // kInput: the input's index; kScratch, kConst: the buffer's index; kI32, kI64: the value; kF32: the float's bits
  int64_t value;
};

struct Launch {
  CUfunction function;
  std::array<unsigned, 3> grid;
  unsigned block;
  unsigned shared;
  std::vector<Param> params;
  size_t trailing;  // pointer parameters the kernel declares past the recorded ones (Triton's scratch), passed null
};

struct Recipe {
  bool python_only = false;
  std::vector<Launch> launches;
  std::vector<int64_t> out_shape;
  at::ScalarType out_dtype = at::kFloat;
  std::vector<int64_t> scratch_bytes;  // one fresh allocation each per call, as the Python path makes them
  std::vector<Tensor> consts;          // tensors Python declared never written again; kept alive here
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};

struct Table {
  std::shared_mutex lock;
  std::unordered_map<Key, Recipe, KeyHash> recipes;
};

Table& table() {
  static Table t;
  return t;
}

// > 0 while the path is off: it starts off until Python turns it on (native.py enable()); tests block it too
std::atomic<int64_t> g_blocked{1};
// ws1_kernels.launches._GLOBAL: the launch logs open in every thread (a Python list, kept alive for the process)
PyObject* g_open_logs = nullptr;

// Whether any launch log is open: one read of the list's length under the GIL (the op may run with it released)
bool observed() {
  if (g_open_logs == nullptr) return false;
  pybind11::gil_scoped_acquire gil;
  return PyList_GET_SIZE(g_open_logs) > 0;
}
std::atomic<int64_t> g_hits{0}, g_misses{0}, g_python_only{0};

// The recipe this thread is recording: set around the redispatch of a miss, filled by add_launch and commit.
struct Pending {
  bool active = false;
  Key key;
  std::vector<Launch> launches;
};
thread_local Pending t_pending;
std::mutex g_reason_lock;
std::string g_last_refusal;

void add_tensor(Key& k, const Tensor& t) {
  k.push_back(t.device().index());
  k.push_back(static_cast<int64_t>(t.scalar_type()));
  k.push_back(t.dim());
  for (int64_t s : t.sizes()) k.push_back(s);
  for (int64_t s : t.strides()) k.push_back(s);
  k.push_back((reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0 ? 1 : 0);
}

void add_double(Key& k, double v) {
  int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  k.push_back(bits);
}

// Launch a recipe on the current stream of the inputs' device.
Tensor run(const Recipe& r, const std::vector<Tensor>& ins) {
  const c10::cuda::CUDAGuard guard(ins[0].device());
  const CUstream stream = c10::cuda::getCurrentCUDAStream(ins[0].device().index()).stream();
  Tensor out = at::empty(r.out_shape, ins[0].options().dtype(r.out_dtype));
  std::vector<Tensor> scratch;  // freed after the launches are queued: the allocator orders reuse on the stream
  scratch.reserve(r.scratch_bytes.size());
  for (int64_t bytes : r.scratch_bytes) scratch.push_back(at::empty({bytes}, ins[0].options().dtype(at::kByte)));
  // not zeroed: every slot a launch passes is written below (its recorded parameters, then the trailing nulls)
  std::array<uint64_t, 64> words;
  std::array<void*, 64> params;
  for (const Launch& l : r.launches) {
    size_t n = 0;
    for (const Param& p : l.params) {
      switch (p.kind) {
        case kInput: words[n] = reinterpret_cast<uint64_t>(ins[p.value].data_ptr()); break;
        case kOutput: words[n] = reinterpret_cast<uint64_t>(out.data_ptr()); break;
        case kI32: {
          const int32_t v = static_cast<int32_t>(p.value);
          std::memcpy(&words[n], &v, sizeof v);
          break;
        }
        case kF32: {
          const uint32_t v = static_cast<uint32_t>(p.value);
          std::memcpy(&words[n], &v, sizeof v);
          break;
        }
        case kI64: words[n] = static_cast<uint64_t>(p.value); break;
        case kNull: words[n] = 0; break;
        case kScratch: words[n] = reinterpret_cast<uint64_t>(scratch[p.value].data_ptr()); break;
        case kConst: words[n] = reinterpret_cast<uint64_t>(r.consts[p.value].data_ptr()); break;
      }
      params[n] = &words[n];
      ++n;
    }
    for (size_t i = 0; i < l.trailing; ++i, ++n) {
      words[n] = 0;
      params[n] = &words[n];
    }
    if (static_cast<uint64_t>(l.grid[0]) * l.grid[1] * l.grid[2] == 0) continue;  // as Triton: no empty launch
    const CUresult rc = driver().launch(l.function, l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, l.shared,
                                        stream, params.data(), nullptr);
    TORCH_CHECK(rc == CUDA_SUCCESS, "ws1_launch: cuLaunchKernel failed: ", cu_error(rc));
  }
  return out;
}

// The fast path of one op: the recipe's launch on a hit, else `slow` (the Python twin), recording on a miss.
template <class Slow>
Tensor fast(int64_t op, const std::vector<Tensor>& ins, std::initializer_list<double> scalars, Slow&& slow) {
  if (g_blocked.load(std::memory_order_relaxed) > 0 || t_pending.active || observed()) return slow();
  Key key;
  key.reserve(8 + 16 * ins.size());
  key.push_back(op);
  for (const Tensor& t : ins) {
    if (!t.is_cuda()) return slow();
    add_tensor(key, t);
  }
  for (double s : scalars) add_double(key, s);
  {
    std::shared_lock<std::shared_mutex> read(table().lock);
    const auto it = table().recipes.find(key);
    if (it != table().recipes.end()) {
      const Recipe& r = it->second;  // recipes are never erased: the reference outlives the lock
      read.unlock();
      if (r.python_only) {
        g_python_only.fetch_add(1, std::memory_order_relaxed);
        return slow();
      }
      g_hits.fetch_add(1, std::memory_order_relaxed);
      return run(r, ins);
    }
  }
  g_misses.fetch_add(1, std::memory_order_relaxed);
  t_pending = Pending{true, std::move(key), {}};
  struct Clear {
    ~Clear() {
      t_pending.active = false;
      t_pending.launches.clear();
    }
  } clear;
  return slow();
}

template <class Sig>
c10::TypedOperatorHandle<Sig> twin(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// ------------------------------------------------------------------------------------------- the step ops

using T2 = Tensor(const Tensor&, const Tensor&);
using T2F = Tensor(const Tensor&, const Tensor&, double);
using T5F = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double);

Tensor embedding(const Tensor& ids, const Tensor& w) {
  static const auto py = twin<T2>("ws1_triton::embedding_py");
  return fast(1, {ids, w}, {}, [&] { return py.call(ids, w); });
}

Tensor norm(const Tensor& x, const Tensor& w, double eps) {
  static const auto py = twin<T2F>("ws1_triton::norm_py");
  return fast(2, {x, w}, {eps}, [&] { return py.call(x, w, eps); });
}

Tensor linear(const Tensor& x, const Tensor& w) {
  static const auto py = twin<T2>("ws1_triton::linear_py");
  return fast(3, {x, w}, {}, [&] { return py.call(x, w); });
}

Tensor rope(const Tensor& x, const Tensor& positions, double theta) {
  static const auto py = twin<T2F>("ws1_triton::rope_py");
  return fast(4, {x, positions}, {theta}, [&] { return py.call(x, positions, theta); });
}

// rope in two parts (the step path makes the angles once per step): the table alone, keyed by its int as a double
Tensor rope_angles(const Tensor& positions, double theta, int64_t dim) {
  static const auto py = twin<Tensor(const Tensor&, double, int64_t)>("ws1_triton::rope_angles_py");
  return fast(8, {positions}, {theta, static_cast<double>(dim)}, [&] { return py.call(positions, theta, dim); });
}

Tensor rope_rotate(const Tensor& x, const Tensor& table) {
  static const auto py = twin<T2>("ws1_triton::rope_rotate_py");
  return fast(9, {x, table}, {}, [&] { return py.call(x, table); });
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_base, const Tensor& n_keys,
                 double scale) {
  static const auto py = twin<T5F>("ws1_triton::attention_py");
  return fast(5, {q, k, v, key_base, n_keys}, {scale}, [&] { return py.call(q, k, v, key_base, n_keys, scale); });
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  static const auto py = twin<T2>("ws1_triton::swiglu_py");
  return fast(6, {gate, up}, {}, [&] { return py.call(gate, up); });
}

Tensor logp(const Tensor& logits, const Tensor& targets) {
  static const auto py = twin<T2>("ws1_triton::logp_py");
  return fast(7, {logits, targets}, {}, [&] { return py.call(logits, targets); });
}

// ------------------------------------------------------------------------------------------- registration

bool pending() { return t_pending.active; }

void add_launch(int64_t function, std::vector<int64_t> grid, int64_t block, int64_t shared, std::vector<int64_t> kinds,
                std::vector<int64_t> values) {
  TORCH_CHECK(t_pending.active, "ws1_launch.add_launch: no recipe is being recorded on this thread");
  TORCH_CHECK(grid.size() == 3, "ws1_launch.add_launch: grid needs 3 values, got ", grid.size());
  TORCH_CHECK(kinds.size() == values.size(), "ws1_launch.add_launch: ", kinds.size(), " kinds for ", values.size(),
              " values");
  Launch l{reinterpret_cast<CUfunction>(static_cast<uintptr_t>(function)),
           {static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2])},
           static_cast<unsigned>(block),
           static_cast<unsigned>(shared),
           {},
           0};
  for (size_t i = 0; i < kinds.size(); ++i) {
    TORCH_CHECK(kinds[i] >= kInput && kinds[i] <= kConst, "ws1_launch.add_launch: parameter ", i, " has kind ",
                kinds[i]);
    l.params.push_back(Param{static_cast<Kind>(kinds[i]), values[i]});
  }
  t_pending.launches.push_back(std::move(l));
}

size_t param_size(Kind k) { return (k == kI32 || k == kF32) ? 4 : 8; }

// Why a parameter names no buffer the recipe has ("" when each does).
std::string check_indices(const Launch& l, size_t n_inputs, size_t n_scratch, size_t n_consts) {
  for (const Param& p : l.params) {
    size_t limit = 0;
    const char* what = nullptr;
    switch (p.kind) {
      case kInput: limit = n_inputs, what = "input "; break;
      case kScratch: limit = n_scratch, what = "scratch buffer "; break;
      case kConst: limit = n_consts, what = "constant "; break;
      default: continue;  // a number or null: no buffer
    }
    if (p.value < 0 || static_cast<size_t>(p.value) >= limit)
      return std::string("a parameter names ") + what + std::to_string(p.value);
  }
  return "";
}

// Why `l` cannot be launched as recorded ("" when it can); sets l.trailing from the kernel's parameter list.
std::string check_against_kernel(Launch& l) {
  const Driver& d = driver();
  if (d.launch == nullptr || d.param_info == nullptr) return "the driver has no cuLaunchKernel or cuFuncGetParamInfo";
  if (l.params.size() + 2 > 64) return "more than 62 parameters";
  size_t declared = 0;
  for (;; ++declared) {
    size_t offset = 0, size = 0;
    if (d.param_info(l.function, declared, &offset, &size) != CUDA_SUCCESS) break;
    if (declared < l.params.size()) {
      if (size != param_size(l.params[declared].kind))
        return "parameter " + std::to_string(declared) + " is " + std::to_string(size) + " bytes in the kernel, " +
               std::to_string(param_size(l.params[declared].kind)) + " as recorded";
    } else if (size != 8) {
      return "the kernel's extra parameter " + std::to_string(declared) + " is not a pointer";
    }
    if (declared > 64) return "the kernel declares more than 64 parameters";
  }
  if (declared < l.params.size())
    return "the kernel declares " + std::to_string(declared) + " parameters, " + std::to_string(l.params.size()) +
           " were recorded";
  if (declared - l.params.size() > 2)
    return "the kernel declares " + std::to_string(declared - l.params.size()) + " parameters past the recorded ones";
  l.trailing = declared - l.params.size();
  return "";
}

// Why the call's buffers cannot be replayed ("" when they can).
std::string check_buffers(const std::vector<int64_t>& scratch_bytes, const std::vector<Tensor>& consts) {
  for (size_t i = 0; i < scratch_bytes.size(); ++i)
    if (scratch_bytes[i] <= 0)
      return "scratch buffer " + std::to_string(i) + " has " + std::to_string(scratch_bytes[i]) + " bytes";
  for (size_t i = 0; i < consts.size(); ++i)
    if (!consts[i].defined() || !consts[i].is_cuda()) return "constant " + std::to_string(i) + " is not a CUDA tensor";
  return "";
}

// Store the pending recipe: its launches (checked against the kernels) with its scratch sizes and constants, or
// Python-only when `reason` is given or a check fails. Returns "" when stored launchable, else why not.
std::string commit(std::vector<int64_t> out_shape, at::ScalarType out_dtype, int64_t n_inputs,
                   std::vector<int64_t> scratch_bytes, std::vector<Tensor> consts, std::string reason) {
  TORCH_CHECK(t_pending.active, "ws1_launch.commit: no recipe is being recorded on this thread");
  Recipe r;
  r.out_shape = std::move(out_shape);
  r.out_dtype = out_dtype;
  if (reason.empty() && t_pending.launches.empty()) reason = "no launch was recorded";
  if (reason.empty()) reason = check_buffers(scratch_bytes, consts);
  for (Launch& l : t_pending.launches) {
    if (!reason.empty()) break;
    reason = check_indices(l, static_cast<size_t>(n_inputs), scratch_bytes.size(), consts.size());
    if (reason.empty()) reason = check_against_kernel(l);
  }
  r.python_only = !reason.empty();
  if (!r.python_only) {
    r.launches = std::move(t_pending.launches);
    r.scratch_bytes = std::move(scratch_bytes);
    r.consts = std::move(consts);
  }
  {
    std::unique_lock<std::shared_mutex> write(table().lock);
    table().recipes.emplace(t_pending.key, std::move(r));
  }
  t_pending.active = false;
  t_pending.launches.clear();
  if (!reason.empty()) {
    std::lock_guard<std::mutex> g(g_reason_lock);
    g_last_refusal = reason;
  }
  return reason;
}

void block(int64_t delta) { g_blocked.fetch_add(delta, std::memory_order_relaxed); }

void watch(const pybind11::list& open_logs) {
  TORCH_CHECK(g_open_logs == nullptr, "ws1_launch_ext.watch: the open launch logs are already watched");
  Py_INCREF(open_logs.ptr());
  g_open_logs = open_logs.ptr();
}

std::vector<int64_t> stats() {
  std::shared_lock<std::shared_mutex> read(table().lock);
  return {g_hits.load(), g_misses.load(), g_python_only.load(), static_cast<int64_t>(table().recipes.size()),
          g_blocked.load()};
}

std::string last_refusal() {
  std::lock_guard<std::mutex> g(g_reason_lock);
  return g_last_refusal;
}

void clear() {
  std::unique_lock<std::shared_mutex> write(table().lock);
  table().recipes.clear();
  g_hits = 0;
  g_misses = 0;
  g_python_only = 0;
}

}  // namespace

// the registry's own ops are one catch-all kernel each (commit's constants are CUDA tensors, but the registry is
// host bookkeeping whatever the device)
TORCH_LIBRARY(ws1_launch, m) {
  m.def("add_launch(int function, int[] grid, int block, int shared, int[] kinds, int[] values) -> ()", &add_launch);
  m.def(
      "commit(int[] out_shape, ScalarType out_dtype, int n_inputs, int[] scratch_bytes, Tensor[] consts, str reason) "
      "-> str",
      &commit);
  m.def("block(int delta) -> ()", &block);
  m.def("stats() -> int[]", &stats);
  m.def("last_refusal() -> str", &last_refusal);
  m.def("clear() -> ()", &clear);
}

TORCH_LIBRARY_IMPL(ws1_triton, CUDA, m) {
  m.impl("embedding", &embedding);
  m.impl("norm", &norm);
  m.impl("linear", &linear);
  m.impl("rope", &rope);
  m.impl("attention", &attention);
  m.impl("swiglu", &swiglu);
  m.impl("logp", &logp);
  m.impl("rope_angles", &rope_angles);
  m.impl("rope_rotate", &rope_rotate);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "the step ops' host path in C++; importing this module registers their CUDA kernels and ws1_launch.*";
  // a plain function, not an op: the Python twin asks on every call, and a dispatcher round trip would cost more
  m.def("pending", &pending, "whether this thread is recording a recipe (the twin then records its launches)");
  m.def("watch", &watch, "the list of open launch logs (ws1_kernels.launches._GLOBAL): any open log blocks replays");
}

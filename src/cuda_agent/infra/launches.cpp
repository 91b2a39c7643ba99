// The judge's observer of kernel launches, loaded into every CUDA worker before any candidate code.
//
// CUPTI's callback API calls `on_api` inside the CUDA driver and runtime whenever a kernel is
// launched, from any thread, whatever library launches it (PyTorch, cuBLAS, cuDNN, Triton, the
// candidate's extension, code resolved by hand): every launch passes one of the launch entry points
// (cuLaunchKernel*, cudaLaunchKernel*, the cooperative and graph launches), so nothing a candidate
// can call from the host goes below it. The callbacks cost host time only (no GPU time is added to
// the kernels, unlike CUDA's activity tracing), so they run on every call, checked and timed alike,
// and nothing of them is visible from Python.
//
// The names a call launched are read and cleared after each call with a secret token set at
// install time. After each call the worker also checks that every callback it enabled is still
// enabled and that its own gate kernel (launched on each gated call) was recorded: a subscriber
// taken away or a callback switched off loses that proof.
//
// Kernels replayed from a CUDA graph are not launched one by one: a graph launch is recorded as
// GRAPH_LAUNCH together with every kernel the process launched while a stream was capturing and
// every kernel added to a graph by hand (a superset of the graph's kernels).
//
// Every launch (direct, or into a graph being captured or built) is also attributed to the code
// that issued it: the chain of loaded images from the launch outward, up to the first that is not
// NVIDIA's (the CUDA driver and runtime, CUPTI, cuBLAS, cuDNN, ...) or the C runtime. A runtime
// launch names its kernel's host stub, whose image is the issuer (one dladdr, cached); a driver
// launch, or a stub inside a vendor library, is attributed by walking the stack (the unwinder
// reads .eh_frame: no frame pointers needed). So a cuBLAS kernel reads "libcublasLt <- libtorch_cuda"
// when torch.mm issued it and "libcublasLt <- the candidate's extension" when the candidate's C++
// called cuBLAS, whether it ran directly or from a graph captured in __init__ or in an earlier call;
// judge/policy.py decides what each may be (`check_kernel_owners`). Attribution is by issuer: code of
// one library launched under another's name (a stub registered by hand for another image's module)
// is beyond it, and so is an issuer the unwinder cannot reach (reported with no issuer).
//
// Between calls the judge's own thread launches kernels of its own (unpacking, flushing): after a
// take that says so (`judge=True`) those are left out until `begin`, while launches from any other
// thread (a team the candidate left running) are kept for the next take instead of being dropped.
//
// CUDA's activity records (CONCURRENT_KERNEL, MEMCPY, MEMSET) are also taken here on the checked
// calls: the kernels that ran, named by the device, and their device time, as Nsight Compute reads
// them. One CUPTI subscriber per process is all CUDA allows, so the worker does not use PyTorch's
// profiler at the same time.
//
// libcupti is not linked: its functions are resolved from the library the worker names (the one
// PyTorch itself loads), so that one process never holds two copies of CUPTI.
#include <cuda.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <unwind.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

constexpr const char* kGraphLaunch = "cuda_agent::graph_launch";
constexpr const char* kHostFunction = "cuda_agent::host_function";
constexpr const char* kUnnamed = "cuda_agent::unnamed_kernel";

// What an enabled callback id stands for.
// kLaunchMulti: a launch whose first parameter is a list of launches, not the kernel.
enum Kind : uint8_t {
  kOther = 0, kLaunch, kLaunchEx, kGraph, kHostFunc, kCaptureBegin, kCaptureEnd, kGraphNode, kLaunchMulti
};

// The owners of a kernel name: interned issuer chains ("image|image|..."), see `issuer`.
using Owners = std::unordered_set<const std::string*>;
using Record = std::unordered_map<std::string, Owners>;

struct Api {
  decltype(&::cuptiSubscribe) subscribe = nullptr;
  decltype(&::cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&::cuptiEnableCallback) enable_callback = nullptr;
  decltype(&::cuptiGetCallbackState) callback_state = nullptr;
  decltype(&::cuptiGetCallbackName) callback_name = nullptr;
  decltype(&::cuptiActivityEnable) activity_enable = nullptr;
  decltype(&::cuptiActivityDisable) activity_disable = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) activity_callbacks = nullptr;
  decltype(&::cuptiActivityFlushAll) activity_flush = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
  CUresult (*func_get_name)(const char**, CUfunction) = nullptr;  // CUDA 12.3+; optional
};

// The leading fields of CUPTI's kernel, memcpy and memset activity records. Each new version of
// those records (CUpti_ActivityKernelN ...) appends fields and keeps these where they were; the
// versioned structs themselves come and go between CUPTI releases, so they are not named here.
struct KernelRecord {
  CUpti_ActivityKind kind;
  uint8_t cache_config;
  uint8_t shared_memory_config;
  uint16_t registers_per_thread;
  int32_t partitioned_requested;
  int32_t partitioned_executed;
  uint64_t start;
  uint64_t end;
  uint64_t completed;
  uint32_t device_id, context_id, stream_id;
  int32_t grid_x, grid_y, grid_z, block_x, block_y, block_z;
  int32_t static_shared, dynamic_shared;
  uint32_t local_per_thread, local_total;
  uint32_t correlation_id;
  int64_t grid_id;
  const char* name;
};
struct MemcpyRecord {
  CUpti_ActivityKind kind;
  uint8_t copy_kind, src_kind, dst_kind, flags;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
};
struct MemsetRecord {
  CUpti_ActivityKind kind;
  uint32_t value;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
};

struct State {
  std::mutex mu;
  Api api;
  bool installed = false;
  std::string token;
  std::string skip;  // a kernel name left out of the activity's device time (the timing gate)
  CUpti_SubscriberHandle subscriber = nullptr;
  std::vector<std::pair<CUpti_CallbackDomain, CUpti_CallbackId>> enabled;
  std::vector<uint8_t> kinds[CUPTI_CB_DOMAIN_SIZE];
  Record seen;      // launched since the last take
  Record captured;  // launched under stream capture or added to a graph, ever
  Owners graph_owners;  // the issuers of the graph launches since the last take
  bool graph_launched = false;
  int capturing = 0;
  // between a take(judge=true) and `begin`: the judge's own thread launches kernels of its own
  bool judge_window = false;
  std::thread::id judge_thread;
  // the activity of a checked call
  bool recording = false;
  std::unordered_set<std::string> activity_names;
  uint64_t activity_ns = 0;
  uint64_t activity_records = 0;
  bool activity_sane = true;
};

State& state() {
  static State* s = new State();  // never destroyed: callbacks may run during interpreter exit
  return *s;
}

Kind kind_of(const char* name) {
  auto starts = [name](const char* p) { return std::strncmp(name, p, std::strlen(p)) == 0; };
  auto has = [name](const char* p) { return std::strstr(name, p) != nullptr; };
  if (has("HostFunc")) return starts("cuLaunch") || starts("cudaLaunch") ? kHostFunc : kOther;
  if (starts("cuGraphLaunch") || starts("cudaGraphLaunch")) return kGraph;
  if (starts("cuLaunchKernelEx") || starts("cudaLaunchKernelEx")) return kLaunchEx;
  if ((starts("cuLaunch") || starts("cudaLaunch")) && has("MultiDevice")) return kLaunchMulti;
  if (starts("cuLaunch") || starts("cudaLaunch")) return kLaunch;
  if (has("BeginCapture")) return kCaptureBegin;
  if (has("EndCapture")) return kCaptureEnd;
  if ((starts("cuGraph") || starts("cudaGraph")) && has("KernelNode") && (has("Add") || has("SetParams")))
    return kGraphNode;
  if ((starts("cuGraph") || starts("cudaGraph")) && (has("AddNode") || has("NodeSetParams"))) return kGraphNode;
  return kOther;
}

// The kernel's name when CUPTI gives no symbol name: from the CUfunction of a driver launch.
const char* function_name(const Api& api, Kind kind, CUpti_CallbackDomain domain, const void* params) {
  if (api.func_get_name == nullptr || domain != CUPTI_CB_DOMAIN_DRIVER_API || params == nullptr) return nullptr;
  // cuLaunchKernel*_params, cuLaunchCooperativeKernel*_params, cuLaunch*_params start with the
  // CUfunction; cuLaunchKernelEx*_params hold the launch config first
  CUfunction f = kind == kLaunchEx ? reinterpret_cast<const CUfunction*>(params)[1]
                                   : reinterpret_cast<const CUfunction*>(params)[0];
  const char* name = nullptr;
  if (f == nullptr || api.func_get_name(&name, f) != CUDA_SUCCESS) return nullptr;
  return name;
}


// ---------------------------------------------------------------------------------------------
// Who issued a launch

// One loaded image (shared library or executable), by its load address.
struct Image {
  std::string path;  // its real path (the name it was loaded by where that cannot be resolved)
  bool pass = false; // NVIDIA's (driver, runtime, CUPTI, vendor libraries) or the C runtime: look past it
  bool self = false; // this observer
};

// Basenames of the images a launch passes through on its way from the issuer to the driver
// (policy.py's _PASS_IMAGE and _VENDOR_IMAGE read the chain the same way). NVIDIA's carry a version
// after ".so." (libcublasLt.so.13; libcublasLt-1b2c3d4e.so.12 in wheels that bundle CUDA); a
// candidate's extension is named `<identifier>.so`, so it can never pass for one of them.
bool passes(const std::string& path) {
  const std::string base = path.substr(path.rfind('/') + 1);
  static const char* const kStems[] = {
      "libcuda.", "libcuda-", "libcudart", "libcupti", "libnvidia-", "libnvperf", "libcublas", "libcudnn",
      "libcufft", "libcurand", "libcusparse", "libcusolver", "libnccl", "libnvrtc", "libnvJitLink", "libcutensor",
      "libnvblas", "libc.", "libc-", "libstdc++", "libgcc_s", "libpthread", "ld-linux", "libm.", "libm-"};
  if (base.find(".so.") == std::string::npos) return false;
  for (const char* stem : kStems)
    if (base.rfind(stem, 0) == 0) return true;
  return false;
}

// Never destroyed, like state(): callbacks may run during interpreter exit.
std::mutex& images_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_map<uintptr_t, const Image*>& images() {
  static auto* m = new std::unordered_map<uintptr_t, const Image*>();
  return *m;
}

const void* self_base() {
  static const void* base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&passes), &info) ? info.dli_fbase : nullptr;
  }();
  return base;
}

// The image holding `addr`, or nullptr (an address in no image: the heap, a stack, JIT code).
const Image* image_of(const void* addr) {
  Dl_info info{};
  if (addr == nullptr || dladdr(addr, &info) == 0 || info.dli_fbase == nullptr) return nullptr;
  const auto key = reinterpret_cast<uintptr_t>(info.dli_fbase);
  std::lock_guard<std::mutex> lock(images_mu());
  auto it = images().find(key);
  if (it != images().end()) return it->second;
  auto* image = new Image();  // kept for the process's life, as images stay mapped
  const char* name = info.dli_fname != nullptr ? info.dli_fname : "";
  char* real = realpath(name, nullptr);
  image->path = real != nullptr ? real : name;
  std::free(real);
  image->self = info.dli_fbase == self_base();
  image->pass = !image->self && passes(image->path);
  images().emplace(key, image);
  return image;
}

// Interned issuer chains: one string per distinct chain, compared by address.
const std::string* intern(const std::string& chain) {
  static auto* mu = new std::mutex();
  static auto* set = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(*mu);
  return &*set->insert(chain).first;
}

struct Walk {
  std::string chain;
  const Image* last = nullptr;
  int frames = 0;
  bool found = false;
};

_Unwind_Reason_Code step(_Unwind_Context* ctx, void* arg) {
  auto* w = static_cast<Walk*>(arg);
  const uintptr_t ip = _Unwind_GetIP(ctx);
  if (ip == 0 || ++w->frames > 96) return _URC_END_OF_STACK;
  const Image* image = image_of(reinterpret_cast<const void*>(ip - 1));
  if (image == nullptr || image->self || image == w->last) return _URC_NO_REASON;
  w->last = image;
  if (!w->chain.empty()) w->chain += '|';
  w->chain += image->path;
  if (image->pass) return _URC_NO_REASON;
  w->found = true;  // the first image past NVIDIA's and the C runtime's: the issuer
  return _URC_END_OF_STACK;
}

// The chain of images from the launch outward, ending at the issuer ("" when the stack could not
// be read at all). `stub`: the host stub a runtime launch names, whose image issued it unless it is
// a vendor library's (then whoever called the vendor library is found on the stack).
const std::string* issuer(const void* stub) {
  thread_local std::unordered_map<const void*, const std::string*> by_stub;
  if (stub != nullptr) {
    auto it = by_stub.find(stub);
    if (it != by_stub.end()) return it->second;
    const Image* image = image_of(stub);
    if (image != nullptr && !image->pass && !image->self) return by_stub[stub] = intern(image->path);
  }
  Walk w;
  _Unwind_Backtrace(&step, &w);
  return intern(w.chain);
}

// The issuer of the runtime launch this thread is inside (its driver launch is the same launch).
thread_local int runtime_depth = 0;
thread_local const std::string* runtime_owner = nullptr;

void note(Record& record, const std::string& key, const std::string* owner) {
  auto it = record.find(key);
  if (it == record.end()) it = record.emplace(key, Owners()).first;
  if (!it->second.count(owner)) it->second.insert(owner);
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  State& s = state();
  if (domain >= CUPTI_CB_DOMAIN_SIZE || cbid >= s.kinds[domain].size()) return;
  const Kind kind = static_cast<Kind>(s.kinds[domain][cbid]);
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (kind == kOther || info == nullptr) return;
  const bool enter = info->callbackSite == CUPTI_API_ENTER;
  if (kind == kCaptureEnd) {
    if (!enter) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.capturing = std::max(0, s.capturing - 1);
    }
    return;
  }
  const bool launch = kind == kLaunch || kind == kLaunchEx || kind == kLaunchMulti;
  if (!enter) {
    if (launch && domain == CUPTI_CB_DOMAIN_RUNTIME_API && runtime_depth > 0 && --runtime_depth == 0)
      runtime_owner = nullptr;
    return;
  }
  if (kind == kCaptureBegin) {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.capturing;
    return;
  }
  const char* name = info->symbolName;
  if ((name == nullptr || *name == '\0') && (kind == kLaunch || kind == kLaunchEx))
    name = function_name(s.api, kind, domain, info->functionParams);
  // Who issued it, found before the lock (the stack walk takes the loader's lock)
  const std::string* owner = nullptr;
  if (launch && domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    // cudaLaunchKernel*_params and cudaLaunchCooperativeKernel*_params start with the stub,
    // cudaLaunchKernelExC*_params hold the launch config first
    const void* stub = nullptr;
    if (info->functionParams != nullptr && kind != kLaunchMulti)
      stub = reinterpret_cast<const void* const*>(info->functionParams)[kind == kLaunchEx ? 1 : 0];
    owner = issuer(stub);
    if (runtime_depth++ == 0) runtime_owner = owner;
  } else if (launch && runtime_depth > 0 && runtime_owner != nullptr) {
    owner = runtime_owner;  // the driver's half of the runtime launch above
  } else {
    owner = issuer(nullptr);
  }
  thread_local std::string key;  // reused: a repeated kernel costs a hash lookup and no allocation
  std::lock_guard<std::mutex> lock(s.mu);
  const bool judges = s.judge_window && std::this_thread::get_id() == s.judge_thread;  // the judge's own work
  switch (kind) {
    case kGraph:
      if (judges) return;
      s.graph_launched = true;
      if (!s.graph_owners.count(owner)) s.graph_owners.insert(owner);
      return;
    case kHostFunc:
      key.assign(kHostFunction);
      break;
    case kGraphNode:
      key.assign(name != nullptr && *name != '\0' ? name : kUnnamed);
      note(s.captured, key, owner);
      return;
    default:
      key.assign(name != nullptr && *name != '\0' ? name : kUnnamed);
  }
  // a kernel captured into a graph is recorded whoever captures it (the candidate's __init__ runs
  // on the judge's thread): its replay is judged by what was captured
  if (s.capturing > 0) note(s.captured, key, owner);
  if (!judges) note(s.seen, key, owner);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kSize = 4 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kSize));
  *size = *buffer != nullptr ? kSize : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  CUpti_Activity* record = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    while (valid > 0 && s.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (!s.recording) continue;  // records of activity outside a checked call's window
      uint64_t start = 0, end = 0;
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const KernelRecord*>(record);
        start = k->start, end = k->end;
        const char* name = k->name != nullptr ? k->name : kUnnamed;
        if (s.skip == name) continue;
        s.activity_names.insert(name);
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const MemcpyRecord*>(record);
        start = m->start, end = m->end;
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const MemsetRecord*>(record);
        start = m->start, end = m->end;
      } else {
        continue;
      }
      ++s.activity_records;
      // the layout check of the records above: a span of an hour or an inverted one is not a record read right
      if (end < start || end - start > 3600ull * 1000000000ull) {
        s.activity_sane = false;
        continue;
      }
      s.activity_ns += end - start;
    }
  }
  std::free(buffer);
}

std::string describe(const Api& api, CUptiResult r) {
  const char* text = nullptr;
  if (api.result_string != nullptr) api.result_string(r, &text);
  return text != nullptr ? std::string(text) : ("CUPTI error " + std::to_string(static_cast<int>(r)));
}

void check_token(const std::string& token) {
  State& s = state();
  if (!s.installed || token.size() != s.token.size() ||
      !std::equal(token.begin(), token.end(), s.token.begin())) {
    throw std::runtime_error("the launch observer belongs to the judge");
  }
}

template <typename F>
void resolve(void* lib, const char* symbol, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, symbol));
  if (out == nullptr) throw std::runtime_error(std::string("libcupti has no ") + symbol);
}

// Subscribe to the launch entry points of the driver and the runtime; `cupti`: the libcupti file.
// Returns how many callback ids were enabled.
int install(const std::string& token, const std::string& cupti, const std::string& skip) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.installed) throw std::runtime_error("the launch observer is already installed");
  if (token.size() < 16) throw std::runtime_error("token too short");
  void* lib = dlopen(cupti.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) throw std::runtime_error(std::string("cannot load libcupti: ") + dlerror());
  Api& api = s.api;
  resolve(lib, "cuptiSubscribe", api.subscribe);
  resolve(lib, "cuptiUnsubscribe", api.unsubscribe);
  resolve(lib, "cuptiEnableCallback", api.enable_callback);
  resolve(lib, "cuptiGetCallbackState", api.callback_state);
  resolve(lib, "cuptiGetCallbackName", api.callback_name);
  resolve(lib, "cuptiActivityEnable", api.activity_enable);
  resolve(lib, "cuptiActivityDisable", api.activity_disable);
  resolve(lib, "cuptiActivityRegisterCallbacks", api.activity_callbacks);
  resolve(lib, "cuptiActivityFlushAll", api.activity_flush);
  resolve(lib, "cuptiActivityGetNextRecord", api.next_record);
  resolve(lib, "cuptiGetResultString", api.result_string);
  if (void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    api.func_get_name = reinterpret_cast<decltype(api.func_get_name)>(dlsym(cuda, "cuFuncGetName"));
  }
  CUptiResult r = api.subscribe(&s.subscriber, reinterpret_cast<CUpti_CallbackFunc>(&on_api), nullptr);
  if (r != CUPTI_SUCCESS) throw std::runtime_error("cuptiSubscribe: " + describe(api, r));
  const CUpti_CallbackDomain domains[] = {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_CB_DOMAIN_RUNTIME_API};
  const uint32_t sizes[] = {CUPTI_DRIVER_TRACE_CBID_SIZE, CUPTI_RUNTIME_TRACE_CBID_SIZE};
  bool launches[2] = {false, false};
  for (int d = 0; d < 2; ++d) {
    // Ids past this header's last are asked for too: a newer CUPTI may have launch entry points
    // this build does not know by name.
    const uint32_t limit = sizes[d] + 1024;
    s.kinds[domains[d]].assign(limit, kOther);
    for (uint32_t cbid = 1; cbid < limit; ++cbid) {
      const char* name = nullptr;
      if (api.callback_name(domains[d], cbid, &name) != CUPTI_SUCCESS || name == nullptr) continue;
      const Kind kind = kind_of(name);
      if (kind == kOther) continue;
      s.kinds[domains[d]][cbid] = kind;  // before the callback can fire
      r = api.enable_callback(1, s.subscriber, domains[d], cbid);
      if (r != CUPTI_SUCCESS) {  // an id this driver does not trace
        s.kinds[domains[d]][cbid] = kOther;
        continue;
      }
      s.enabled.emplace_back(domains[d], cbid);
      launches[d] = launches[d] || kind == kLaunch;
    }
  }
  if (!launches[0] && !launches[1]) {
    api.unsubscribe(s.subscriber);
    throw std::runtime_error("CUPTI offered no launch callback to enable");
  }
  r = api.activity_callbacks(&buffer_requested, &buffer_completed);
  if (r != CUPTI_SUCCESS) {
    api.unsubscribe(s.subscriber);
    throw std::runtime_error("cuptiActivityRegisterCallbacks: " + describe(api, r));
  }
  s.token = token;
  s.skip = skip;
  s.installed = true;
  return static_cast<int>(s.enabled.size());
}

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  char* plain = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || plain == nullptr) return name;
  std::string out(plain);
  std::free(plain);
  return out;
}

// The kernels launched since the last take, each with its issuers (see `issuer`): demangled,
// sorted, with GRAPH_LAUNCH and the kernels a graph may hold (their issuers at capture) when a
// graph was launched; the record starts empty again. `judge`: what the calling thread launches
// from now until `begin` is the judge's own work, left out (other threads' launches are kept).
std::vector<std::pair<std::string, std::vector<std::string>>> take_owned(const std::string& token, bool judge) {
  check_token(token);
  State& s = state();
  Record names;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    names.swap(s.seen);
    if (s.graph_launched) {
      names[kGraphLaunch].insert(s.graph_owners.begin(), s.graph_owners.end());
      for (const auto& [name, owners] : s.captured) names[name].insert(owners.begin(), owners.end());
    }
    s.graph_launched = false;
    s.graph_owners.clear();
    s.judge_window = judge;
    s.judge_thread = std::this_thread::get_id();
  }
  std::unordered_map<std::string, std::unordered_set<std::string>> plain;
  for (const auto& [name, owners] : names) {
    auto& out = plain[demangle(name)];
    for (const std::string* o : owners) out.insert(*o);
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  out.reserve(plain.size());
  for (auto& [name, owners] : plain) {
    std::vector<std::string> sorted(owners.begin(), owners.end());
    std::sort(sorted.begin(), sorted.end());
    out.emplace_back(name, std::move(sorted));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> take(const std::string& token, bool judge) {
  std::vector<std::string> out;
  for (auto& [name, owners] : take_owned(token, judge)) out.push_back(std::move(name));
  return out;
}

// The start of a call: the judge's own window (take with judge=true) closes, and everything
// launched since that take (by other threads) stays recorded for the call's take.
void begin(const std::string& token) {
  check_token(token);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.judge_window = false;
}

// Every callback enabled at install time, and only those, still enabled (cheap: run after every call).
std::vector<std::string> disabled(const std::string& token) {
  check_token(token);
  State& s = state();
  std::vector<std::string> out;
  for (const auto& [domain, cbid] : s.enabled) {
    uint32_t on = 0;
    if (s.api.callback_state(&on, s.subscriber, domain, cbid) != CUPTI_SUCCESS || on == 0) {
      const char* name = nullptr;
      s.api.callback_name(domain, cbid, &name);
      out.emplace_back(name != nullptr ? name : std::to_string(cbid));
    }
  }
  return out;
}

const CUpti_ActivityKind kActivityKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET};

// CUDA's activity records on, for a checked call.
void activity_start(const std::string& token) {
  check_token(token);
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.activity_names.clear();
    s.activity_ns = 0;
    s.activity_records = 0;
    s.activity_sane = true;
    s.recording = true;
  }
  for (CUpti_ActivityKind k : kActivityKinds) {
    CUptiResult r = s.api.activity_enable(k);
    if (r != CUPTI_SUCCESS) throw std::runtime_error("cuptiActivityEnable: " + describe(s.api, r));
  }
}

// Off again (before the judge's own work on the outputs); the records are read by `activity_take`.
void activity_stop(const std::string& token) {
  check_token(token);
  State& s = state();
  for (CUpti_ActivityKind k : kActivityKinds) s.api.activity_disable(k);
}

// The records since `activity_start`: (kernel names, device ms of kernels and copies, or -1 when
// the records did not read as expected).
std::pair<std::vector<std::string>, double> activity_take(const std::string& token) {
  check_token(token);
  State& s = state();
  s.api.activity_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(s.mu);
  s.recording = false;
  std::vector<std::string> names;
  for (const auto& n : s.activity_names) names.push_back(demangle(n));
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  const double ms = s.activity_sane ? static_cast<double>(s.activity_ns) / 1e6 : -1.0;
  return {names, ms};
}

// Whether a process of this CUPTI warm-starts the activity machinery (its first use takes seconds).
void warm(const std::string& token) {
  activity_start(token);
  activity_stop(token);
  activity_take(token);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, pybind11::arg("token"), pybind11::arg("cupti"), pybind11::arg("skip") = "");
  m.def("take", &take, pybind11::arg("token"), pybind11::arg("judge") = false);
  m.def("take_owned", &take_owned, pybind11::arg("token"), pybind11::arg("judge") = false);
  m.def("begin", &begin, pybind11::arg("token"));
  m.def("disabled", &disabled, pybind11::arg("token"));
  m.def("activity_start", &activity_start, pybind11::arg("token"));
  m.def("activity_stop", &activity_stop, pybind11::arg("token"));
  m.def("activity_take", &activity_take, pybind11::arg("token"));
  m.def("warm", &warm, pybind11::arg("token"));
  m.attr("GRAPH_LAUNCH") = kGraphLaunch;
  m.attr("HOST_FUNCTION") = kHostFunction;
  m.attr("UNNAMED") = kUnnamed;
}

// The judge's observer of dispatched operators, loaded into every worker before any candidate code.
//
// A global RecordFunction callback (scope FUNCTION) sees every operator that enters the dispatcher
// through Dispatcher::call / callBoxed, before any dispatch key is looked at: guards that exclude
// dispatch keys, the Python dispatcher and TorchDispatchModes change where an operator goes, not
// whether this callback runs. Nothing of it is visible from Python (no mode on a stack, no profiler
// flag), and it runs on every call alike, so its cost tells a candidate nothing.
//
// The worker reads and clears the record after each call with a secret token it set at install
// time; a candidate that loads this module again gets neither the record nor a way to clear it.
// After each call the worker runs a sentinel through RecordFunction and requires it in the record:
// a callback removed (at::clearCallbacks) or RecordFunction switched off on the calling thread
// loses the sentinel too.
#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

constexpr const char* kSentinel = "cuda_agent::observer_sentinel";

struct State {
  std::mutex mu;
  // Names of operators seen since the last take. Dispatcher operator names live as long as the
  // operator's registration; copying keeps names of operators registered and dropped meanwhile.
  std::unordered_set<std::string> seen;
  // Pointer cache of the names already in `seen`, so a repeated operator costs one lookup and no
  // allocation. Only pointers of dispatcher schemas (stable for the registration) go in here.
  std::unordered_set<const char*> known;
  std::string token;
  bool installed = false;
  at::CallbackHandle handle = 0;
};

State& state() {
  static State* s = new State();  // never destroyed: callbacks may run during interpreter exit
  return *s;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr) return nullptr;
  State& s = state();
  const bool stable = fn.operator_name().has_value();
  std::lock_guard<std::mutex> lock(s.mu);
  if (stable) {
    if (s.known.count(name)) return nullptr;
    s.known.insert(name);
  }
  s.seen.emplace(name);
  return nullptr;
}

void check_token(const std::string& token) {
  State& s = state();
  if (!s.installed || token.size() != s.token.size() ||
      !std::equal(token.begin(), token.end(), s.token.begin())) {
    throw std::runtime_error("the observer belongs to the judge");
  }
}

void install(const std::string& token) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.installed) throw std::runtime_error("the observer is already installed");
  if (token.size() < 16) throw std::runtime_error("token too short");
  s.token = token;
  s.handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_enter).needsInputs(false).scopes({at::RecordScope::FUNCTION}));
  s.installed = true;
}

// Names recorded since the last take, sorted; the record starts empty again.
std::vector<std::string> take(const std::string& token) {
  check_token(token);
  State& s = state();
  std::vector<std::string> out;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    out.assign(s.seen.begin(), s.seen.end());
    s.seen.clear();
    s.known.clear();
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A RecordFunction of scope FUNCTION on the calling thread, as every operator call makes.
void sentinel() {
  at::RecordFunction guard(at::RecordScope::FUNCTION);
  if (guard.isActive()) guard.before(std::string_view(kSentinel));
}

// A RecordFunction of that name: the worker marks uses of things no operator stands for.
void mark(const std::string& name) {
  at::RecordFunction guard(at::RecordScope::FUNCTION);
  if (guard.isActive()) guard.before(std::string_view(name));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, pybind11::arg("token"));
  m.def("take", &take, pybind11::arg("token"));
  m.def("sentinel", &sentinel);
  m.def("mark", &mark, pybind11::arg("name"));
  m.attr("SENTINEL") = kSentinel;
}

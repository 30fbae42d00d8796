#include "transport/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdarg>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "mem/memalloc.h"
#include "meshccl_config.h"
#include "bootstrap/identity.h"
#include "plugins/builtin.h"
#include "transport/plugin_guard.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

// The last warning a transport logged on this thread since the library last
// called into it: the reason behind a failed call, for the error message.
thread_local std::string t_warning;

void host_log(int level, const char* file, int line, const char* fmt, ...) {
  LogLevel l = level == MESHCCL_LOG_WARN   ? LogLevel::Warn
               : level == MESHCCL_LOG_INFO ? LogLevel::Info
                                           : LogLevel::Trace;
  if (!log_enabled(l, kNet) && l != LogLevel::Warn) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  log_msg(l, kNet, file, line, "%s", msg);
  if (l == LogLevel::Warn) t_warning = msg;
}

const char* host_get_param(const char* name) { return param_by_name(name); }

int host_find_shared(const void* ptr, size_t size, meshccl_shared_region_v1_t* out) {
  return mem_find_shared(ptr, size, out) ? 1 : 0;
}

// Code is loaded only from places other users cannot write: a directory or
// library writable by others (world-writable, sticky /tmp included) could
// hold anyone's code. "" when path may be loaded (or does not exist).
std::string unsafe_to_load(const std::string& dir, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";  // dlopen reports it missing
  if ((st.st_mode & S_IWOTH) != 0) return "the library is writable by other users";
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) return "the library belongs to another user";
  if (::stat(dir.c_str(), &st) != 0) return "";
  if ((st.st_mode & S_IWOTH) != 0) return "its directory is writable by other users";
  return "";
}

// The directory of the file this code was loaded from (libmeshccl.so,
// libnccl.so, or a program linked with the archive), absolute and with links
// resolved, so that plugins are found relative to the library wherever its
// tree was installed, staged or moved to. The main program's link map has no
// name (dladdr then reports argv[0], which may be relative or a bare name
// found on PATH): its file is /proc/self/exe. Taken when the library loads,
// before the program can change its working directory.
std::string this_library_dir() {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&host_log), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0)
    return "";
  const char* file =
      map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0' ? map->l_name : "/proc/self/exe";
  char* real = realpath(file, nullptr);
  if (real == nullptr) return "";
  std::string dir = real;
  std::free(real);
  return dir.substr(0, dir.rfind('/'));
}
const std::string g_library_dir = this_library_dir();

// MESHCCL_PLUGIN_PATH, then relative to the library: <libdir>/meshccl (where
// meson installs them), seen from the libdir or, for an installed program
// linked with the archive (meshccl_info), from <prefix>/<bindir>; the build
// tree's plugins/ beside the library or one level up (a program of the
// build tree, build/tools/meshccl_info); then the prefix the library was
// configured for.
std::vector<std::string> plugin_dirs() {
  std::vector<std::string> dirs;
  std::string path = param_str(Param::PluginPath);
  size_t pos = 0;
  while (!path.empty() && pos <= path.size()) {
    size_t end = path.find(':', pos);
    if (end == std::string::npos) end = path.size();
    if (end > pos) dirs.push_back(path.substr(pos, end - pos));
    pos = end + 1;
  }
  if (!g_library_dir.empty()) {
    dirs.push_back(g_library_dir + "/meshccl");
    const std::string bin = "/" MESHCCL_BINDIR;
    if (g_library_dir.size() > bin.size() &&
        g_library_dir.compare(g_library_dir.size() - bin.size(), bin.size(), bin) == 0)
      dirs.push_back(g_library_dir.substr(0, g_library_dir.size() - bin.size()) + "/" MESHCCL_LIBDIR "/meshccl");
    dirs.push_back(g_library_dir + "/plugins");
    size_t up = g_library_dir.rfind('/');
    if (up != std::string::npos && up > 0) dirs.push_back(g_library_dir.substr(0, up) + "/plugins");
  }
  dirs.push_back(MESHCCL_PLUGIN_DIR);
  return dirs;
}

const meshccl_builtin_transport_t* builtin(const std::string& name) {
  for (const meshccl_builtin_transport_t* b = meshccl_builtin_transports; b->transport != nullptr; ++b)
    if (name == b->transport->name) return b;
  return nullptr;
}

std::string builtin_names() {
  std::string s;
  for (const meshccl_builtin_transport_t* b = meshccl_builtin_transports; b->transport != nullptr; ++b)
    s += std::string(s.empty() ? "" : ", ") + b->transport->name;
  return s;
}

// Where a plugin file is: its path and the index of its directory on the
// search path.
struct Located {
  std::string path;
  size_t dir = 0;
};

// The first file on the search path for the plugin of that name that may be
// loaded; nothing is loaded.
bool locate_plugin(const std::string& name, Located* at, std::string* why) {
  if (!transport_name_ok(name)) {
    *why = "\"" + name + "\" is not a transport name (1 to 15 of a-z, 0-9, '_' and '-')";
    return false;
  }
  const std::string file = "libmeshccl-transport-" + name + ".so";
  std::string tried;
  const std::vector<std::string> dirs = plugin_dirs();
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string p = dirs[i] + "/" + file;
    if (::access(p.c_str(), F_OK) != 0) {
      tried += " " + p;
      continue;
    }
    const std::string unsafe = unsafe_to_load(dirs[i], p);
    if (!unsafe.empty()) {
      tried += " " + p + " (refused: " + unsafe + ")";
      continue;
    }
    char* real = realpath(p.c_str(), nullptr);
    at->path = real != nullptr ? real : p;
    at->dir = i;
    std::free(real);
    return true;
  }
  *why = "transport \"" + name + "\" is neither built in (" + builtin_names() + ") nor found as a plugin (tried" +
         tried + ")";
  return false;
}

// The plugin names of every libmeshccl-transport-<name>.so in the search
// path's directories, each once, in the order found.
std::vector<std::string> plugin_files() {
  std::vector<std::string> names;
  for (const std::string& dir : plugin_dirs()) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> here;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      const std::string pre = "libmeshccl-transport-", suf = ".so";
      if (n.size() <= pre.size() + suf.size() || n.compare(0, pre.size(), pre) != 0 ||
          n.compare(n.size() - suf.size(), suf.size(), suf) != 0)
        continue;
      here.push_back(n.substr(pre.size(), n.size() - pre.size() - suf.size()));
    }
    closedir(d);
    std::sort(here.begin(), here.end());
    for (const std::string& name : here)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

// A plugin's place among plugins: its directory on the search path, then
// the build's order (MESHCCL_PLUGIN_PREFERENCE), then its name.
struct PluginKey {
  size_t dir;
  size_t build;
  std::string name;
  bool operator<(const PluginKey& o) const {
    return dir != o.dir ? dir < o.dir : build != o.build ? build < o.build : name < o.name;
  }
};

size_t build_rank(const std::string& name) {
  const std::string order = MESHCCL_PLUGIN_PREFERENCE;
  size_t rank = 0, pos = 0;
  while (pos <= order.size()) {
    size_t end = order.find(',', pos);
    if (end == std::string::npos) end = order.size();
    if (order.compare(pos, end - pos, name) == 0 && end > pos) return rank;
    ++rank;
    pos = end + 1;
  }
  return rank;  // after every plugin the build names
}

struct Loaded {
  const meshccl_transport_v1_t* api = nullptr;
  meshccl_transport_v1_probe_t probe = nullptr;      // optional (transport.h)
  meshccl_transport_v1_wait_fd_t wait_fd = nullptr;  // optional (transport.h)
  std::string path;
  std::string problem;  // why it did not load ("" when it did)
  int scope = 0;        // its properties' scope, once read
};

std::mutex g_mu;
// Plugins by name, once dlopen was tried; built-in ones once their
// properties were read.
std::map<std::string, Loaded>& g_loaded() {
  static std::map<std::string, Loaded> m;
  return m;
}

// What a context of the transport declares about itself (transport.h's
// properties): a context is opened, asked and closed, with the signal
// dispositions kept as in Transport::open. Its log lines go to TRACE; a
// warning it gives is the reason it failed.
void probe_log(int level, const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (level == MESHCCL_LOG_WARN) t_warning = msg;
  if (log_enabled(LogLevel::Trace, kNet)) log_msg(LogLevel::Trace, kNet, file, line, "(properties) %s", msg);
}

bool read_scope(const meshccl_transport_v1_t* api, int* scope, std::string* why) {
  static const meshccl_transport_host_v1_t host = {MESHCCL_TRANSPORT_V1, probe_log, host_get_param,
                                                   host_find_shared,     0,         1};
  t_warning.clear();
  SignalKeeper keep;
  void* ctx = nullptr;
  const int rc = api->init(&host, &ctx);
  meshccl_transport_props_v1_t props{};
  const int prc = rc == MESHCCL_T_SUCCESS ? api->properties(ctx, 0, &props) : rc;
  if (ctx != nullptr) api->finalize(ctx);
  const std::string restored = keep.restore();
  if (!restored.empty())
    MC_INFO(kInit | kNet, "transport %s: put back the handlers its init installed for %s", api->name, restored.c_str());
  if (rc != MESHCCL_T_SUCCESS) {
    *why = std::string("transport ") + api->name +
           ": init failed: " + (t_warning.empty() ? "the plugin gave no reason" : t_warning);
    return false;
  }
  if (prc != MESHCCL_T_SUCCESS) {
    *why = std::string("transport ") + api->name + ": properties failed (" + std::to_string(prc) + ")";
    return false;
  }
  if (props.scope != MESHCCL_SCOPE_HOST && props.scope != MESHCCL_SCOPE_NETWORK) {
    *why = std::string("transport ") + api->name + " declares scope " + std::to_string(props.scope) +
           ", neither MESHCCL_SCOPE_HOST nor MESHCCL_SCOPE_NETWORK";
    return false;
  }
  *scope = props.scope;
  return true;
}

// dlopen in a private working directory, with the signal dispositions kept
// (plugin_guard.h).
Loaded open_plugin(const std::string& name, const std::string& path, std::string* restored) {
  Loaded l;
  l.path = path;
  SignalKeeper keep;
  void* h = nullptr;
  std::string err;
  if (!run_in_root_dir(
          [&] {
            h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
            if (h == nullptr) err = dlerror();
          },
          &err)) {
    l.problem = path + " was not loaded: " + err;
    return l;
  }
  *restored = keep.restore();
  if (h == nullptr) {
    l.problem = path + ": " + err;
    return l;
  }
  l.api = static_cast<const meshccl_transport_v1_t*>(dlsym(h, "meshccl_transport_v1"));
  if (l.api == nullptr || l.api->version != MESHCCL_TRANSPORT_V1) {
    dlclose(h);
    l.api = nullptr;
    l.problem = path + " does not export a meshccl_transport_v1 interface";
    return l;
  }
  if (l.api->name == nullptr || name != l.api->name) {
    l.problem = path + " exports a transport named \"" + (l.api->name != nullptr ? l.api->name : "(null)") +
                "\", not \"" + name + "\"";
    l.api = nullptr;  // kept loaded: its code may already run threads
    return l;
  }
  l.probe = reinterpret_cast<meshccl_transport_v1_probe_t>(dlsym(h, "meshccl_transport_v1_probe"));
  l.wait_fd = reinterpret_cast<meshccl_transport_v1_wait_fd_t>(dlsym(h, "meshccl_transport_v1_wait_fd"));
  return l;
}

// The registry's entry for a transport, loaded (plugins) and its scope read,
// with g_mu held. nullptr with *why when it does not load or initialise.
const Loaded* load_locked(const std::string& name, std::string* why) {
  auto it = g_loaded().find(name);
  if (const meshccl_builtin_transport_t* b = builtin(name)) {
    if (it == g_loaded().end()) {
      Loaded l;
      l.api = b->transport;
      l.probe = b->probe;
      l.wait_fd = b->wait_fd;
      l.path = "built in";
      it = g_loaded().emplace(name, l).first;
    }
  } else if (it == g_loaded().end()) {
    Located at;
    if (!locate_plugin(name, &at, why)) return nullptr;  // may be installed later: not remembered
    std::string restored;
    it = g_loaded().emplace(name, open_plugin(name, at.path, &restored)).first;
    if (it->second.api != nullptr)
      MC_INFO(kInit | kNet, "transport %s: loaded %s%s%s", name.c_str(), at.path.c_str(),
              restored.empty() ? "" : "; put back the handlers its libraries installed for ", restored.c_str());
  }
  Loaded& l = it->second;
  if (l.api == nullptr) {
    *why = l.problem;
    return nullptr;
  }
  if (l.scope == 0) {
    if (!read_scope(l.api, &l.scope, why)) {
      MC_INFO(kInit | kNet, "%s; not used", why->c_str());
      return nullptr;
    }
    MC_INFO(kInit | kNet, "transport %s: %s scope (%s)", name.c_str(), scope_name(l.scope), l.path.c_str());
  }
  return &l;
}

}  // namespace

const char* scope_name(int scope) {
  return scope == MESHCCL_SCOPE_HOST ? "node" : scope == MESHCCL_SCOPE_NETWORK ? "network" : "unknown";
}

std::vector<TransportInfo> transport_list() {
  std::vector<TransportInfo> builtins, plugins;
  std::vector<PluginKey> keys;
  for (const meshccl_builtin_transport_t* b = meshccl_builtin_transports; b->transport != nullptr; ++b) {
    TransportInfo t;
    t.name = b->transport->name;
    t.path = "built in";
    t.builtin = true;
    std::lock_guard<std::mutex> lock(g_mu);
    if (load_locked(t.name, &t.problem) != nullptr) t.scope = g_loaded()[t.name].scope;
    builtins.push_back(t);
  }
  for (const std::string& name : plugin_files()) {
    TransportInfo t;
    Located at;
    if (builtin(name) != nullptr || !locate_plugin(name, &at, &t.problem)) continue;
    t.name = name;
    t.path = at.path;
    t.scope = transport_scope(name);
    plugins.push_back(t);
    keys.push_back(PluginKey{at.dir, build_rank(name), name});
  }
  std::vector<size_t> order(plugins.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<TransportInfo> all = builtins;
  for (size_t k = 0; k < order.size(); ++k) {
    all.push_back(plugins[order[k]]);
    all.back().preference = static_cast<int>(k);
  }
  for (size_t k = 0; k < builtins.size(); ++k) all[k].preference = static_cast<int>(order.size() + k);
  return all;
}

bool transport_exists(const std::string& name, std::string* why) {
  if (builtin(name) != nullptr) return true;
  Located at;
  return locate_plugin(name, &at, why);
}

bool load_transport(const std::string& name, const meshccl_transport_v1_t** out, std::string* why) {
  std::lock_guard<std::mutex> lock(g_mu);
  const Loaded* l = load_locked(name, why);
  *out = l != nullptr ? l->api : nullptr;
  return l != nullptr;
}

int transport_scope(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_loaded().find(name);
  return it != g_loaded().end() && it->second.api != nullptr ? it->second.scope : 0;
}

meshccl_transport_v1_probe_t transport_probe(const meshccl_transport_v1_t* api) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [name, l] : g_loaded())
    if (l.api == api) return l.probe;
  for (const meshccl_builtin_transport_t* b = meshccl_builtin_transports; b->transport != nullptr; ++b)
    if (b->transport == api) return b->probe;
  return nullptr;
}

meshccl_transport_v1_wait_fd_t transport_wait_fd(const meshccl_transport_v1_t* api) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [name, l] : g_loaded())
    if (l.api == api) return l.wait_fd;
  for (const meshccl_builtin_transport_t* b = meshccl_builtin_transports; b->transport != nullptr; ++b)
    if (b->transport == api) return b->wait_fd;
  return nullptr;
}

Status find_transport(const std::string& name, const meshccl_transport_v1_t** out) {
  std::string why;
  if (load_transport(name, out, &why)) return kOk;
  return MC_ERROR(ncclInvalidUsage, "%s", why.c_str());
}

std::vector<TransportInfo> transport_inventory() {
  std::vector<TransportInfo> all = transport_list();
  for (TransportInfo& t : all) {
    const meshccl_transport_v1_t* api = nullptr;
    t.problem.clear();
    if (!load_transport(t.name, &api, &t.problem)) continue;
    t.scope = transport_scope(t.name);
    if (t.builtin) {
      t.version = "meshccl " MESHCCL_VERSION_STRING;
      continue;
    }
    void* h = dlopen(t.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    auto* describe =
        h != nullptr ? reinterpret_cast<const char* (*)()>(dlsym(h, "meshccl_transport_v1_describe")) : nullptr;
    t.version = describe != nullptr ? describe() : "interface v1";
    if (h != nullptr) dlclose(h);  // drops only the NOLOAD reference
  }
  // Files on the search path that cannot hold a transport of their name.
  for (const std::string& name : plugin_files()) {
    if (transport_name_ok(name)) continue;
    TransportInfo t;
    t.name = name;
    t.path = "libmeshccl-transport-" + name + ".so";
    t.problem = "\"" + name + "\" is not a transport name (1 to 15 of a-z, 0-9, '_' and '-')";
    all.push_back(t);
  }
  return all;
}

Status Transport::open(const meshccl_transport_v1_t* api, int rank, int nranks, std::unique_ptr<Transport>* out) {
  static meshccl_transport_host_v1_t host_template = {MESHCCL_TRANSPORT_V1, host_log, host_get_param,
                                                      host_find_shared,     0,        0};
  // The plugin keeps the pointer until finalize: one static per (rank,nranks)
  // would race across communicators, so each context gets its own copy.
  auto* host = new meshccl_transport_host_v1_t(host_template);
  host->rank = rank;
  host->nranks = nranks;
  void* ctx = nullptr;
  t_warning.clear();
  SignalKeeper keep;  // the plugin's libraries may install handlers as they set up (plugin_guard.h)
  int rc = api->init(host, &ctx);
  const std::string restored = keep.restore();
  if (!restored.empty())
    MC_INFO(kInit | kNet, "transport %s: put back the handlers its init installed for %s", api->name, restored.c_str());
  if (rc != MESHCCL_T_SUCCESS) {
    delete host;
    return MC_ERROR(static_cast<ncclResult_t>(rc), "transport %s: init failed: %s", api->name,
                    t_warning.empty() ? "the plugin gave no reason" : t_warning.c_str());
  }
  std::unique_ptr<Transport> t(new Transport(api, ctx));
  t->probe_ = transport_probe(api);
  t->wait_fd_ = transport_wait_fd(api);
  t->host_.reset(host);
  rc = api->properties(ctx, 0, &t->props_);
  if (rc != MESHCCL_T_SUCCESS) return t->check(rc, "properties");
  *out = std::move(t);
  return kOk;
}

Transport::~Transport() {
  if (ctx_ != nullptr) api_->finalize(ctx_);
}

Status Transport::check(int rc, const char* what) const {
  if (rc == MESHCCL_T_SUCCESS) return kOk;
  ncclResult_t code = rc == MESHCCL_T_REMOTE_ERROR    ? ncclRemoteError
                      : rc == MESHCCL_T_INVALID_USAGE ? ncclInvalidUsage
                      : rc == MESHCCL_T_SYSTEM_ERROR  ? ncclSystemError
                                                      : ncclInternalError;
  return MC_ERROR(code, "transport %s: %s failed (%s)", api_->name, what,
                  code == ncclRemoteError ? "peer exited or connection lost" : "see the lines above");
}

Status Transport::listen(void* handle, void** lc) { return check(api_->listen(ctx_, 0, handle, lc), "listen"); }
Status Transport::connect(const void* handle, void** sc) {
  return check(api_->connect(ctx_, 0, handle, sc), "connect");
}
Status Transport::accept(void* lc, void** rc) { return check(api_->accept(lc, rc), "accept"); }
Status Transport::isend(void* sc, const void* data, size_t size, uint64_t tag, void** req) {
  t_warning.clear();
  return check(api_->isend(sc, data, size, tag, nullptr, req), "send");
}
Status Transport::irecv(void* rc, void* data, size_t size, uint64_t tag, void** req) {
  t_warning.clear();
  return check(api_->irecv(rc, data, size, tag, nullptr, req), "receive");
}
Status Transport::test(void* req, bool* done, size_t* size) {
  t_warning.clear();
  int d = 0;
  size_t sz = 0;
  int rc = api_->test(req, &d, &sz);
  *done = d != 0;
  if (size) *size = sz;
  return check(rc, "transfer");
}
Status Transport::probe(void* rc, uint64_t tag, bool* found) {
  *found = false;
  if (probe_ == nullptr)
    return MC_ERROR(ncclInvalidUsage,
                    "transport %s cannot receive from any source: its plugin exports no meshccl_transport_v1_probe",
                    api_->name);
  t_warning.clear();
  int f = 0;
  int rc_probe = probe_(rc, tag, &f);
  *found = f != 0;
  return check(rc_probe, "probe");
}
int Transport::wait_fd() {
  if (wait_fd_ == nullptr) return -1;
  int fd = -1;
  // A failing arm only means: do not block now; the next test says why.
  if (wait_fd_(ctx_, &fd) != MESHCCL_T_SUCCESS) return -1;
  return fd;
}
const std::string& transport_warning() { return t_warning; }

void Transport::close_send(void* c) {
  if (c) api_->close_send(c);
}
void Transport::close_recv(void* c) {
  if (c) api_->close_recv(c);
}
void Transport::close_listen(void* c) {
  if (c) api_->close_listen(c);
}

}  // namespace meshccl

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

const meshccl_transport_v1_t* const kBuiltin[] = {&meshccl_transport_shm, &meshccl_transport_socket};

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

// The first file on the search path for the plugin of that name that may be
// loaded; nothing is loaded.
bool locate_plugin(const std::string& name, std::string* path, std::string* why) {
  const std::string file = "libmeshccl-transport-" + name + ".so";
  std::string tried;
  for (const std::string& dir : plugin_dirs()) {
    const std::string p = dir + "/" + file;
    if (::access(p.c_str(), F_OK) != 0) {
      tried += " " + p;
      continue;
    }
    const std::string unsafe = unsafe_to_load(dir, p);
    if (!unsafe.empty()) {
      tried += " " + p + " (refused: " + unsafe + ")";
      continue;
    }
    char* real = realpath(p.c_str(), nullptr);
    *path = real != nullptr ? real : p;
    std::free(real);
    return true;
  }
  *why = "transport \"" + name + "\" is neither built in (shm, socket) nor found as a plugin (tried" + tried + ")";
  return false;
}

const meshccl_transport_v1_t* builtin(const std::string& name) {
  for (const meshccl_transport_v1_t* t : kBuiltin)
    if (name == t->name) return t;
  return nullptr;
}

struct Loaded {
  const meshccl_transport_v1_t* api = nullptr;
  meshccl_transport_v1_probe_t probe = nullptr;  // optional (transport.h)
  std::string path;
  std::string problem;  // why it did not load ("" when it did)
};

std::mutex g_mu;
std::map<std::string, Loaded>& g_loaded() {
  static std::map<std::string, Loaded> m;
  return m;
}

// dlopen in a private working directory, with the signal dispositions kept
// (plugin_guard.h). Logs which file the transport came from.
Loaded open_plugin(const std::string& name, const std::string& path) {
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
  const std::string restored = keep.restore();
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
  l.probe = reinterpret_cast<meshccl_transport_v1_probe_t>(dlsym(h, "meshccl_transport_v1_probe"));
  MC_INFO(kInit | kNet, "transport %s: loaded %s%s%s", name.c_str(), path.c_str(),
          restored.empty() ? "" : "; put back the handlers its libraries installed for ", restored.c_str());
  return l;
}

}  // namespace

bool transport_exists(const std::string& name, std::string* why) {
  if (builtin(name) != nullptr) return true;
  std::string path;
  return locate_plugin(name, &path, why);
}

bool load_transport(const std::string& name, const meshccl_transport_v1_t** out, std::string* why) {
  if ((*out = builtin(name)) != nullptr) return true;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_loaded().find(name);
  if (it == g_loaded().end()) {
    std::string path;
    if (!locate_plugin(name, &path, why)) return false;  // may be installed later: not remembered
    it = g_loaded().emplace(name, open_plugin(name, path)).first;
  }
  *out = it->second.api;
  if (*out == nullptr) *why = it->second.problem;
  return *out != nullptr;
}

meshccl_transport_v1_probe_t transport_probe(const meshccl_transport_v1_t* api) {
  if (api == &meshccl_transport_shm) return meshccl_transport_shm_probe;
  if (api == &meshccl_transport_socket) return meshccl_transport_socket_probe;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [name, l] : g_loaded())
    if (l.api == api) return l.probe;
  return nullptr;
}

Status find_transport(const std::string& name, const meshccl_transport_v1_t** out) {
  std::string why;
  if (load_transport(name, out, &why)) return kOk;
  return MC_ERROR(ncclInvalidUsage, "%s", why.c_str());
}

std::vector<TransportInfo> transport_inventory() {
  std::vector<TransportInfo> all;
  for (const meshccl_transport_v1_t* t : kBuiltin)
    all.push_back(TransportInfo{t->name, "built in", "meshccl " MESHCCL_VERSION_STRING, ""});
  std::vector<std::string> seen;
  for (const std::string& dir : plugin_dirs()) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      const std::string pre = "libmeshccl-transport-", suf = ".so";
      if (n.size() <= pre.size() + suf.size() || n.compare(0, pre.size(), pre) != 0 ||
          n.compare(n.size() - suf.size(), suf.size(), suf) != 0)
        continue;
      std::string name = n.substr(pre.size(), n.size() - pre.size() - suf.size());
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;  // an earlier directory wins
      seen.push_back(name);
      TransportInfo info{name, dir + "/" + n, "", ""};
      const meshccl_transport_v1_t* api = nullptr;
      std::string why;
      if (!load_transport(name, &api, &why)) {
        info.problem = why;
      } else {
        std::lock_guard<std::mutex> lock(g_mu);
        info.path = g_loaded()[name].path;
        void* h = dlopen(info.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        auto* describe =
            h != nullptr ? reinterpret_cast<const char* (*)()>(dlsym(h, "meshccl_transport_v1_describe")) : nullptr;
        info.version = describe != nullptr ? describe() : "interface v1";
        if (h != nullptr) dlclose(h);  // drops only the NOLOAD reference
      }
      all.push_back(info);
    }
    closedir(d);
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

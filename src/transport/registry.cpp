#include "transport/registry.h"

#include <dirent.h>
#include <dlfcn.h>
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
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";  // dlopen reports it missing
  if ((st.st_mode & S_IWOTH) != 0) return "the library is writable by other users";
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) return "the library belongs to another user";
  if (::stat(dir.c_str(), &st) != 0) return "";
  if ((st.st_mode & S_IWOTH) != 0) return "its directory is writable by other users";
  return "";
}

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
  // Next to this library, then the install location.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&host_log), &info) != 0 && info.dli_fname != nullptr) {
    std::string lib = info.dli_fname;
    size_t slash = lib.rfind('/');
    if (slash != std::string::npos) {
      std::string dir = lib.substr(0, slash);
      dirs.push_back(dir);
      dirs.push_back(dir + "/plugins");
      // A program of the build tree (build/tools/meshccl_info) linked
      // statically finds build/plugins one level up.
      size_t up = dir.rfind('/');
      if (up != std::string::npos && up > 0) dirs.push_back(dir.substr(0, up) + "/plugins");
    }
  }
  dirs.push_back(MESHCCL_PLUGIN_DIR);
  return dirs;
}

}  // namespace

namespace {

struct Loaded {
  const meshccl_transport_v1_t* api;
  std::string path;
};

std::mutex g_mu;
std::map<std::string, Loaded>& g_loaded() {
  static std::map<std::string, Loaded> m;
  return m;
}

}  // namespace

bool load_transport(const std::string& name, const meshccl_transport_v1_t** out, std::string* why) {
  for (const meshccl_transport_v1_t* t : kBuiltin) {
    if (name == t->name) {
      *out = t;
      return true;
    }
  }
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_loaded().find(name);
  if (it != g_loaded().end()) {
    *out = it->second.api;
    return true;
  }
  std::string file = "libmeshccl-transport-" + name + ".so";
  std::string tried;
  for (const std::string& dir : plugin_dirs()) {
    std::string path = dir + "/" + file;
    std::string unsafe = unsafe_to_load(dir, path);
    if (!unsafe.empty()) {
      tried += " " + path + " (refused: " + unsafe + ")";
      continue;
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      if (::access(path.c_str(), F_OK) == 0) tried += " " + path + " (" + dlerror() + ")";
      else tried += " " + path;
      continue;
    }
    auto* api = static_cast<const meshccl_transport_v1_t*>(dlsym(h, "meshccl_transport_v1"));
    if (api == nullptr || api->version != MESHCCL_TRANSPORT_V1) {
      dlclose(h);
      *why = path + " does not export a meshccl_transport_v1 interface";
      return false;
    }
    g_loaded()[name] = Loaded{api, path};
    *out = api;
    return true;
  }
  *why = "transport \"" + name + "\" is neither built in (shm, socket) nor found as a plugin (tried" + tried + ")";
  return false;
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
        if (char* real = realpath(info.path.c_str(), nullptr)) {
          info.path = real;
          std::free(real);
        }
        void* h = dlopen(info.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        auto* describe = h != nullptr ? reinterpret_cast<const char* (*)()>(dlsym(h, "meshccl_transport_v1_describe")) : nullptr;
        info.version = describe != nullptr ? describe() : "interface v1";
        if (h != nullptr) dlclose(h);  // drops only the NOLOAD reference
      }
      all.push_back(info);
    }
    closedir(d);
  }
  return all;
}

Status Transport::open(const meshccl_transport_v1_t* api, int rank, int nranks,
                       std::unique_ptr<Transport>* out) {
  static meshccl_transport_host_v1_t host_template = {
      MESHCCL_TRANSPORT_V1, host_log, host_get_param, host_find_shared, 0, 0};
  // The plugin keeps the pointer until finalize: one static per (rank,nranks)
  // would race across communicators, so each context gets its own copy.
  auto* host = new meshccl_transport_host_v1_t(host_template);
  host->rank = rank;
  host->nranks = nranks;
  void* ctx = nullptr;
  t_warning.clear();
  int rc = api->init(host, &ctx);
  if (rc != MESHCCL_T_SUCCESS) {
    delete host;
    return MC_ERROR(static_cast<ncclResult_t>(rc), "transport %s: init failed: %s", api->name,
                    t_warning.empty() ? "the plugin gave no reason" : t_warning.c_str());
  }
  std::unique_ptr<Transport> t(new Transport(api, ctx));
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
Status Transport::connect(const void* handle, void** sc) { return check(api_->connect(ctx_, 0, handle, sc), "connect"); }
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
const std::string& transport_warning() { return t_warning; }

void Transport::close_send(void* c) { if (c) api_->close_send(c); }
void Transport::close_recv(void* c) { if (c) api_->close_recv(c); }
void Transport::close_listen(void* c) { if (c) api_->close_listen(c); }

}  // namespace meshccl

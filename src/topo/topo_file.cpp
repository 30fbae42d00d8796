// meshccl's topology format, reading and writing.
#include "topo/topo_file.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include <unistd.h>

#include "topo/xml.h"
#include "util/file_check.h"

namespace meshccl {

namespace {

constexpr int kFormatVersion = 1;
constexpr int kMaxLinksWritten = 64;  // ranks up to which every pair's link is written
constexpr size_t kMaxFileBytes = size_t{16} << 20;

// Shortest text that reads back as the same double.
std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

bool fail(XmlError* err, const XmlElement& el, std::string what) {
  err->line = el.line;
  err->what = std::move(what);
  return false;
}

bool cpus_attr(const XmlElement& el, bool required, CpuSet* out, XmlError* err) {
  std::string text;
  if (!xml_string(el, "cpus", required, &text, err)) return false;
  if (el.attr("cpus") == nullptr) return true;
  std::string why;
  if (!CpuSet::parse_list(text, out, &why)) return fail(err, el, why + " in attribute 'cpus' of <" + el.name + ">");
  return true;
}

bool int_attr(const XmlElement& el, const char* key, int64_t lo, int64_t hi, bool required, int* out, XmlError* err) {
  int64_t v = *out;
  if (!xml_int(el, key, lo, hi, required, &v, err)) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_host(const XmlElement& el, HostTopo* h, XmlError* err) {
  static const char* const kHostAttrs[] = {"name", "source", "numa_gbs", "cross_numa_gbs", "bw_source", nullptr};
  if (!xml_known_attrs(el, kHostAttrs, err)) return false;
  if (!xml_string(el, "name", true, &h->name, err)) return false;
  if (h->name.empty()) return fail(err, el, "empty attribute 'name' of <host>");
  h->source = "file";
  if (!xml_string(el, "source", false, &h->source, err)) return false;
  if (!xml_double(el, "numa_gbs", false, &h->numa_gbs, err)) return false;
  if (!xml_double(el, "cross_numa_gbs", false, &h->cross_numa_gbs, err)) return false;
  if (!xml_string(el, "bw_source", false, &h->bw_source, err)) return false;
  std::set<int> numa_ids;
  for (const XmlElement& c : el.children) {
    if (c.name == "package") {
      static const char* const k[] = {"id", "cpus", nullptr};
      TopoPackage p;
      if (!xml_known_attrs(c, k, err) || !int_attr(c, "id", 0, 1 << 20, true, &p.id, err) ||
          !cpus_attr(c, true, &p.cpus, err))
        return false;
      h->packages.push_back(std::move(p));
    } else if (c.name == "numa") {
      static const char* const k[] = {"id", "package", "cpus", "memory_mb", nullptr};
      TopoNuma n;
      int64_t mem = 0;
      if (!xml_known_attrs(c, k, err) || !int_attr(c, "id", 0, 1 << 20, true, &n.id, err) ||
          !int_attr(c, "package", -1, 1 << 20, false, &n.package, err) || !cpus_attr(c, true, &n.cpus, err) ||
          !xml_int(c, "memory_mb", 0, int64_t{1} << 40, false, &mem, err))
        return false;
      n.memory_mb = static_cast<uint64_t>(mem);
      if (!numa_ids.insert(n.id).second) return fail(err, c, "NUMA node " + std::to_string(n.id) + " given twice");
      h->numa.push_back(std::move(n));
    } else if (c.name == "core") {
      static const char* const k[] = {"cpus", nullptr};
      TopoCore core;
      if (!xml_known_attrs(c, k, err) || !cpus_attr(c, true, &core.cpus, err)) return false;
      h->cores.push_back(std::move(core));
    } else if (c.name == "cache") {
      static const char* const k[] = {"level", "kind", "size_kb", "cpus", nullptr};
      TopoCache cache;
      int64_t size = 0;
      if (!xml_known_attrs(c, k, err) || !int_attr(c, "level", 1, 5, true, &cache.level, err) ||
          !xml_string(c, "kind", true, &cache.kind, err) ||
          !xml_int(c, "size_kb", 0, int64_t{1} << 40, true, &size, err) || !cpus_attr(c, true, &cache.cpus, err))
        return false;
      if (cache.kind != "data" && cache.kind != "instruction" && cache.kind != "unified")
        return fail(err, c, "bad cache kind '" + cache.kind + "' (want data, instruction or unified)");
      cache.size_kb = static_cast<uint64_t>(size);
      h->caches.push_back(std::move(cache));
    } else if (c.name == "gpu" || c.name == "nic") {
      static const char* const k[] = {"busid", "class", "numa", "name", "speed_gbs", "dev", "rank", nullptr};
      TopoPci p;
      p.kind = c.name == "gpu" ? TopoPci::Kind::kGpu : TopoPci::Kind::kNic;
      uint64_t cls = 0;
      if (!xml_known_attrs(c, k, err) || !xml_string(c, "busid", false, &p.busid, err) ||
          !xml_hex(c, "class", false, &cls, err) || !int_attr(c, "numa", -1, 1 << 20, false, &p.numa, err) ||
          !xml_string(c, "name", false, &p.name, err) || !xml_double(c, "speed_gbs", false, &p.speed_gbs, err) ||
          !int_attr(c, "dev", -1, 1 << 20, false, &p.gpu_dev, err) ||
          !int_attr(c, "rank", -1, 1 << 30, false, &p.gpu_rank, err))
        return false;
      if (cls > 0xffffff) return fail(err, c, "PCI class wider than 24 bits in <" + c.name + ">");
      p.pci_class = static_cast<uint32_t>(cls);
      h->pci.push_back(std::move(p));
    } else {
      return fail(err, c, "unknown element <" + c.name + "> in <host> (want package, numa, core, cache, gpu, nic)");
    }
    if (!c.children.empty()) return fail(err, c.children[0], "<" + c.name + "> has no child elements");
  }
  if (h->numa.empty()) return fail(err, el, "<host name=\"" + h->name + "\"> has no <numa> node");
  for (const TopoPci& p : h->pci)
    if (p.numa >= 0 && numa_ids.count(p.numa) == 0)
      return fail(err, el,
                  "a PCI device of host " + h->name + " names NUMA node " + std::to_string(p.numa) +
                      ", which the host does not have");
  return true;
}

bool parse_meshccl(const XmlElement& root, TopoFile* out, XmlError* err) {
  static const char* const kRootAttrs[] = {"version", nullptr};
  int64_t version = 0;
  if (!xml_known_attrs(root, kRootAttrs, err) || !xml_int(root, "version", 0, 1 << 20, true, &version, err))
    return false;
  if (version != kFormatVersion)
    return fail(err, root,
                "unsupported meshccl_topology version " + std::to_string(version) + " (this build reads " +
                    std::to_string(kFormatVersion) + ")");
  struct LinkDecl {
    int a, b, line;
    LinkClass cls;
    std::string bw;
  };
  std::vector<LinkDecl> links;
  std::set<std::string> names;
  for (const XmlElement& c : root.children) {
    if (c.name == "host") {
      if (!out->ranks.empty() || !links.empty()) return fail(err, c, "<host> after <rank> or <link>");
      HostTopo h;
      if (!parse_host(c, &h, err)) return false;
      if (!names.insert(h.name).second) return fail(err, c, "host name '" + h.name + "' given twice");
      out->hosts.push_back(std::move(h));
    } else if (c.name == "rank") {
      static const char* const k[] = {"id", "host", "numa", "cpus", "ifname", "net_gbs", nullptr};
      RankPlace p;
      int id = -1;
      if (!xml_known_attrs(c, k, err) || !int_attr(c, "id", 0, 1 << 30, true, &id, err) ||
          !int_attr(c, "host", 0, 1 << 20, true, &p.host, err) ||
          !int_attr(c, "numa", -1, 1 << 20, true, &p.numa, err) || !cpus_attr(c, false, &p.cpus, err) ||
          !xml_string(c, "ifname", false, &p.ifname, err) || !xml_double(c, "net_gbs", false, &p.net_gbs, err))
        return false;
      if (id != static_cast<int>(out->ranks.size()))
        return fail(err, c,
                    "rank " + std::to_string(id) + " out of order (ranks are listed 0, 1, 2, ...; expected " +
                        std::to_string(out->ranks.size()) + ")");
      if (p.host >= static_cast<int>(out->hosts.size()))
        return fail(err, c,
                    "rank " + std::to_string(id) + " is on host " + std::to_string(p.host) + " but the file has " +
                        std::to_string(out->hosts.size()) + " host(s)");
      if (p.numa >= 0 && out->hosts[p.host].find_numa(p.numa) == nullptr)
        return fail(err, c,
                    "rank " + std::to_string(id) + " is on NUMA node " + std::to_string(p.numa) + ", which host " +
                        out->hosts[p.host].name + " does not have");
      if (!c.children.empty()) return fail(err, c.children[0], "<rank> has no child elements");
      out->ranks.push_back(std::move(p));
    } else if (c.name == "link") {
      static const char* const k[] = {"a", "b", "class", "bw_gbs", nullptr};
      LinkDecl d{0, 0, c.line, LinkClass::kSelf, {}};
      std::string cls;
      double bw = 0;
      if (!xml_known_attrs(c, k, err) || !int_attr(c, "a", 0, 1 << 30, true, &d.a, err) ||
          !int_attr(c, "b", 0, 1 << 30, true, &d.b, err) || !xml_string(c, "class", true, &cls, err) ||
          !xml_double(c, "bw_gbs", true, &bw, err))
        return false;
      if (!link_class_from_name(cls, &d.cls))
        return fail(err, c, "unknown link class '" + cls + "' (want self, same_numa, cross_numa or network)");
      d.bw = num(bw);
      links.push_back(d);
    } else {
      return fail(err, c, "unknown element <" + c.name + "> in <meshccl_topology> (want host, rank, link)");
    }
  }
  if (out->hosts.empty()) return fail(err, root, "<meshccl_topology> describes no <host>");
  // Links are derived from the placements; a file that says otherwise was
  // edited inconsistently.
  SystemGraph g;
  g.hosts = out->hosts;
  g.ranks = out->ranks;
  for (const LinkDecl& d : links) {
    XmlElement at;
    at.line = d.line;
    if (d.a >= g.nranks() || d.b >= g.nranks())
      return fail(err, at,
                  "link " + std::to_string(d.a) + "-" + std::to_string(d.b) + " names a rank the file does not place");
    const Link l = g.link(d.a, d.b);
    if (l.cls != d.cls || num(l.bw_gbs) != d.bw)
      return fail(err, at,
                  "link " + std::to_string(d.a) + "-" + std::to_string(d.b) + " says " + link_class_name(d.cls) + " " +
                      d.bw + " GB/s but the rank placements give " + link_class_name(l.cls) + " " + num(l.bw_gbs) +
                      " GB/s");
  }
  return true;
}

void write_host(const HostTopo& h, std::string* s) {
  *s += "  <host name=\"" + xml_escape(h.name) + "\" source=\"" + xml_escape(h.source) + "\" numa_gbs=\"" +
        num(h.numa_gbs) + "\" cross_numa_gbs=\"" + num(h.cross_numa_gbs) + "\" bw_source=\"" + xml_escape(h.bw_source) +
        "\">\n";
  for (const TopoPackage& p : h.packages)
    *s += "    <package id=\"" + std::to_string(p.id) + "\" cpus=\"" + p.cpus.to_list() + "\"/>\n";
  for (const TopoNuma& n : h.numa)
    *s += "    <numa id=\"" + std::to_string(n.id) + "\" package=\"" + std::to_string(n.package) + "\" cpus=\"" +
          n.cpus.to_list() + "\" memory_mb=\"" + std::to_string(n.memory_mb) + "\"/>\n";
  for (const TopoCore& c : h.cores) *s += "    <core cpus=\"" + c.cpus.to_list() + "\"/>\n";
  for (const TopoCache& c : h.caches)
    *s += "    <cache level=\"" + std::to_string(c.level) + "\" kind=\"" + c.kind + "\" size_kb=\"" +
          std::to_string(c.size_kb) + "\" cpus=\"" + c.cpus.to_list() + "\"/>\n";
  for (const TopoPci& p : h.pci) {
    char cls[16];
    std::snprintf(cls, sizeof(cls), "0x%06x", p.pci_class);
    if (p.kind == TopoPci::Kind::kGpu) {
      *s += "    <gpu busid=\"" + xml_escape(p.busid) + "\" class=\"" + cls + "\" numa=\"" + std::to_string(p.numa) +
            "\" dev=\"" + std::to_string(p.gpu_dev) + "\" rank=\"" + std::to_string(p.gpu_rank) + "\"/>\n";
    } else {
      *s += "    <nic busid=\"" + xml_escape(p.busid) + "\" class=\"" + cls + "\" numa=\"" + std::to_string(p.numa) +
            "\" name=\"" + xml_escape(p.name) + "\" speed_gbs=\"" + num(p.speed_gbs) + "\"/>\n";
    }
  }
  *s += "  </host>\n";
}

}  // namespace

bool topo_parse(const std::string& name, const char* data, size_t size, TopoFile* out, std::string* err) {
  *out = TopoFile{};
  XmlElement root;
  XmlError xe;
  bool ok = xml_parse(data, size, &root, &xe);
  if (ok) {
    if (root.name == "meshccl_topology") {
      out->format = TopoFile::Format::kMeshccl;
      ok = parse_meshccl(root, out, &xe);
    } else if (root.name == "system") {
      out->format = TopoFile::Format::kNccl;
      out->hosts.emplace_back();
      ok = nccl_system_to_host(root, &out->hosts[0], &xe);
      if (ok && out->hosts[0].name.empty()) out->hosts[0].name = "host0";
      if (ok) out->hosts[0].source = "NCCL topology " + name;
    } else {
      ok = fail(&xe, root, "unknown root element <" + root.name + "> (want <meshccl_topology> or NCCL's <system>)");
    }
  }
  if (!ok) {
    *err = name + ":" + std::to_string(xe.line) + ": " + xe.what;
    *out = TopoFile{};
  }
  return ok;
}

Status topo_read_file(const std::string& path, TopoFile* out) {
  // The file steers placement and interface choice: only a regular file that
  // no other user could have written is read.
  std::string why;
  const int fd = open_trusted_input(path, &why);
  if (fd < 0) return MC_ERROR(ncclInvalidArgument, "topology file %s: refused: %s", path.c_str(), why.c_str());
  std::unique_ptr<FILE, int (*)(FILE*)> f(fdopen(fd, "rb"), std::fclose);
  if (!f) {
    close(fd);
    return MC_ERROR(ncclSystemError, "topology file %s: fdopen: %s", path.c_str(), std::strerror(errno));
  }
  std::string data;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) {
    data.append(buf, n);
    if (data.size() > kMaxFileBytes)
      return MC_ERROR(ncclInvalidArgument, "topology file %s: larger than %zu bytes", path.c_str(), kMaxFileBytes);
  }
  if (std::ferror(f.get()))
    return MC_ERROR(ncclInvalidArgument, "topology file %s: read error: %s", path.c_str(), std::strerror(errno));
  std::string err;
  if (!topo_parse(path, data.data(), data.size(), out, &err))
    return MC_ERROR(ncclInvalidArgument, "topology file %s", err.c_str());
  return kOk;
}

std::string host_to_xml(const HostTopo& host) {
  std::string s = "<meshccl_topology version=\"" + std::to_string(kFormatVersion) + "\">\n";
  write_host(host, &s);
  return s + "</meshccl_topology>\n";
}

std::string topo_to_xml(const SystemGraph& g) {
  std::string s = "<meshccl_topology version=\"" + std::to_string(kFormatVersion) + "\">\n";
  for (const HostTopo& h : g.hosts) write_host(h, &s);
  for (int r = 0; r < g.nranks(); ++r) {
    const RankPlace& p = g.ranks[r];
    s += "  <rank id=\"" + std::to_string(r) + "\" host=\"" + std::to_string(p.host) + "\" numa=\"" +
         std::to_string(p.numa) + "\" cpus=\"" + p.cpus.to_list() + "\" ifname=\"" + xml_escape(p.ifname) +
         "\" net_gbs=\"" + num(p.net_gbs) + "\"/>\n";
  }
  if (g.nranks() <= kMaxLinksWritten) {
    for (int a = 0; a < g.nranks(); ++a) {
      for (int b = a + 1; b < g.nranks(); ++b) {
        const Link l = g.link(a, b);
        s += "  <link a=\"" + std::to_string(a) + "\" b=\"" + std::to_string(b) + "\" class=\"" +
             link_class_name(l.cls) + "\" bw_gbs=\"" + num(l.bw_gbs) + "\"/>\n";
      }
    }
  }
  return s + "</meshccl_topology>\n";
}

Status topo_write_file(const std::string& path, const SystemGraph& g) {
  const std::string text = topo_to_xml(g);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(::gettid());
  std::string why;
  const int fd = open_private_output(tmp, &why);  // its name is predictable: not through a planted link
  FILE* f = fd >= 0 ? fdopen(fd, "wb") : nullptr;
  if (f == nullptr) {
    if (fd >= 0) {
      why = std::strerror(errno);
      close(fd);
    }
    return MC_ERROR(ncclSystemError, "MESHCCL_TOPO_DUMP_FILE %s: cannot create: %s", path.c_str(), why.c_str());
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return MC_ERROR(ncclSystemError, "MESHCCL_TOPO_DUMP_FILE %s: cannot write: %s", path.c_str(), std::strerror(e));
  }
  return kOk;
}

}  // namespace meshccl

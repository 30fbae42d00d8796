// NCCL's topology XML (NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE) into a host
// description. The file is one host: <system> holds one <cpu> per NUMA node
// (numaid, affinity as a hex CPU mask), under which <pci> trees (nested
// through switches) end in GPUs (<gpu dev=...> or a display-class device) and
// NICs (<nic><net name=... speed=Mbit/s/></nic>, or a network-class device).
// Attributes this library has no use for are accepted and ignored, as NCCL
// versions keep adding them; unknown elements are errors.
#include <set>

#include "topo/topo_file.h"
#include "topo/xml.h"

namespace meshccl {

namespace {

bool fail(XmlError* err, const XmlElement& el, std::string what) {
  err->line = el.line;
  err->what = std::move(what);
  return false;
}

bool unknown(XmlError* err, const XmlElement& el, const char* parent, const char* allowed) {
  return fail(err, el, "unknown element <" + el.name + "> in <" + parent + "> (NCCL topology allows " + allowed + ")");
}

bool leaf_only(XmlError* err, const XmlElement& el) {
  if (!el.children.empty()) return unknown(err, el.children[0], el.name.c_str(), "no child elements");
  return true;
}

struct Walker {
  HostTopo* host;
  XmlError* err;

  bool nic(const XmlElement& el, int numa, const std::string& busid, uint32_t cls) {
    bool any = false;
    for (const XmlElement& c : el.children) {
      if (c.name != "net") return unknown(err, c, "nic", "<net>");
      if (!leaf_only(err, c)) return false;
      TopoPci p;
      p.kind = TopoPci::Kind::kNic;
      p.busid = busid;
      p.pci_class = cls;
      p.numa = numa;
      double mbps = 0;
      if (!xml_string(c, "name", false, &p.name, err) || !xml_double(c, "speed", false, &mbps, err)) return false;
      p.speed_gbs = mbps / 8000.0;  // Mbit/s -> GB/s
      host->pci.push_back(std::move(p));
      any = true;
    }
    if (!any) {  // a NIC whose ports were not listed
      TopoPci p;
      p.busid = busid;
      p.pci_class = cls;
      p.numa = numa;
      host->pci.push_back(std::move(p));
    }
    return true;
  }

  bool gpu(const XmlElement& el, int numa, const std::string& busid, uint32_t cls) {
    for (const XmlElement& c : el.children)
      if (c.name != "nvlink" && c.name != "c2c") return unknown(err, c, "gpu", "<nvlink>, <c2c>");
    for (const XmlElement& c : el.children)
      if (!leaf_only(err, c)) return false;
    TopoPci p;
    p.kind = TopoPci::Kind::kGpu;
    p.busid = busid;
    p.pci_class = cls;
    p.numa = numa;
    int64_t dev = host->gpu_count(), rank = -1;
    if (!xml_int(el, "dev", 0, 1 << 20, false, &dev, err) || !xml_int(el, "rank", 0, 1 << 30, false, &rank, err))
      return false;
    p.gpu_dev = static_cast<int>(dev);
    p.gpu_rank = static_cast<int>(rank);
    host->pci.push_back(std::move(p));
    return true;
  }

  bool pci(const XmlElement& el, int numa) {
    std::string busid;
    uint64_t cls = 0;
    if (!xml_string(el, "busid", false, &busid, err) || !xml_hex(el, "class", false, &cls, err)) return false;
    if (cls > 0xffffff) return fail(err, el, "PCI class '" + *el.attr("class") + "' wider than 24 bits in <pci>");
    bool has_dev = false;
    for (const XmlElement& c : el.children) {
      if (c.name == "pci") {
        if (!pci(c, numa)) return false;
      } else if (c.name == "gpu") {
        if (!gpu(c, numa, busid, static_cast<uint32_t>(cls))) return false;
        has_dev = true;
      } else if (c.name == "nic") {
        if (!nic(c, numa, busid, static_cast<uint32_t>(cls))) return false;
        has_dev = true;
      } else if (c.name == "pcilink") {
        if (!leaf_only(err, c)) return false;
      } else {
        return unknown(err, c, "pci", "<pci>, <gpu>, <nic>, <pcilink>");
      }
    }
    // A bare device (as in hand-written files): its class says what it is.
    if (!has_dev) {
      const uint32_t base = static_cast<uint32_t>(cls >> 16);
      if (base == 0x03) {
        XmlElement none;
        none.line = el.line;
        if (!gpu(none, numa, busid, static_cast<uint32_t>(cls))) return false;
      } else if (base == 0x02) {
        XmlElement none;
        if (!nic(none, numa, busid, static_cast<uint32_t>(cls))) return false;
      }
    }
    return true;
  }

  bool cpu(const XmlElement& el, std::set<int>* ids) {
    int64_t id = 0;
    if (!xml_int(el, "numaid", 0, 1 << 20, true, &id, err)) return false;
    if (!ids->insert(static_cast<int>(id)).second)
      return fail(err, el, "numaid " + std::to_string(id) + " given to two <cpu> elements");
    TopoNuma n;
    n.id = static_cast<int>(id);
    n.package = n.id;  // the format does not say which NUMA nodes share a package
    if (const std::string* aff = el.attr("affinity")) {
      std::string why;
      if (!CpuSet::parse_hex_mask(*aff, &n.cpus, &why)) return fail(err, el, why + " in attribute 'affinity' of <cpu>");
    }
    host->packages.push_back({n.id, n.cpus});
    host->numa.push_back(n);
    for (const XmlElement& c : el.children) {
      if (c.name == "pci") {
        if (!pci(c, n.id)) return false;
      } else if (c.name == "nic") {
        if (!nic(c, n.id, "", 0)) return false;
      } else {
        return unknown(err, c, "cpu", "<pci>, <nic>");
      }
    }
    return true;
  }
};

}  // namespace

bool nccl_system_to_host(const XmlElement& root, HostTopo* out, XmlError* err) {
  HostTopo h;
  h.bw_source = "nominal";
  Walker w{&h, err};
  std::set<int> ids;
  for (const XmlElement& c : root.children) {
    if (c.name != "cpu") return unknown(err, c, "system", "<cpu>");
    if (!w.cpu(c, &ids)) return false;
  }
  if (h.numa.empty()) return fail(err, root, "<system> has no <cpu> element (no NUMA node described)");
  *out = std::move(h);
  return true;
}

}  // namespace meshccl

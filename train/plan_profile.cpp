#include "plan_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data.h"
#include "model.h"
#include "optim.h"

namespace meshtrain {

namespace {

double thread_cpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace

Profile profile_compute(const ModelConfig& model, const std::vector<int>& micro_batches, int reps, int cores) {
  Profile p;
  p.cores = std::max(1, cores);
  // Three one-layer stages of a three-layer model: the middle one is a bare
  // layer, the first adds the embedding, the last the head and the loss.
  ModelConfig m = model;
  m.layers = 3;
  const Layout l{1, 3, 1};
  for (int b : micro_batches) {
    Stage first(m, l, Coords{0, 0, 0}, b, 1), mid(m, l, Coords{0, 1, 0}, b, 1), last(m, l, Coords{0, 2, 0}, b, 1);
    std::vector<int32_t> tok(static_cast<size_t>(b) * m.seq, 65), tgt(tok.size(), 66);
    double f[3] = {1e30, 1e30, 1e30}, bw[3] = {1e30, 1e30, 1e30};
    Stage* st[3] = {&first, &mid, &last};
    for (int r = 0; r < reps; r++) {
      for (int k = 0; k < 3; k++) {
        double t0 = thread_cpu();
        st[k]->forward(0, tok.data(), tgt.data());
        const double t1 = thread_cpu();
        st[k]->backward(0, 1.0f, {});
        const double t2 = thread_cpu();
        f[k] = std::min(f[k], t1 - t0);
        bw[k] = std::min(bw[k], t2 - t1);
      }
    }
    MicroProfile mp;
    mp.micro_batch = b;
    mp.layer_fwd = f[1];
    mp.layer_bwd = bw[1];
    mp.embed_fb = std::max(0.0, f[0] + bw[0] - f[1] - bw[1]);
    mp.head_fb = std::max(0.0, f[2] + bw[2] - f[1] - bw[1]);
    p.micro.push_back(mp);
  }
  // AdamW over a million parameters, plus zeroing the gradients.
  const size_t n = size_t(1) << 20;
  std::vector<float> params(n, 0.01f), grads(n, 0.001f);
  std::vector<ParamSpec> specs(1);
  specs[0].name = "w";
  specs[0].size = n;
  specs[0].decay = true;
  AdamW opt(n);
  OptimConfig oc;
  double best = 1e30;
  for (int r = 0; r < std::max(2, reps); r++) {
    const double t0 = thread_cpu();
    opt.update(params, grads, specs, oc, 1e-3f, r + 1, 1.0f);
    std::fill(grads.begin(), grads.end(), 0.001f);
    best = std::min(best, thread_cpu() - t0);
  }
  p.update_per_param = best / n;
  return p;
}

void save_profile(const std::string& path, const Profile& p, const LinkModel& links) {
  std::ofstream f(path, std::ios::trunc);
  f.precision(9);
  f << "# meshtrain plan profile: seconds and seconds per byte\n";
  f << "cores " << p.cores << "\n";
  f << "update_per_param " << p.update_per_param << "\n";
  for (const auto& m : p.micro) {
    f << "micro " << m.micro_batch << " " << m.layer_fwd << " " << m.layer_bwd << " " << m.embed_fb << " " << m.head_fb
      << "\n";
  }
  // Where a fit was measured: on a job's ranks `stride` apart (none: any
  // placement), the pairs' phase, and the cores a rank used meanwhile.
  auto where = [](const LinkModel::Fit& c, bool pair) {
    std::string out;
    if (c.stride > 0) out += " stride=" + std::to_string(c.stride);
    if (c.stride > 0 && pair) out += " phase=" + std::to_string(c.phase);
    char buf[64];
    if (c.cpu != 1) {
      std::snprintf(buf, sizeof buf, " cpu=%.3f", c.cpu);
      out += buf;
    }
    for (size_t i = 0; i < c.at_bytes.size() && i < c.at_seconds.size(); i++) {
      std::snprintf(buf, sizeof buf, "%s%.0f:%.9g", i ? "," : " at=", c.at_bytes[i], c.at_seconds[i]);
      out += buf;
    }
    return out;
  };
  for (const auto& c : links.collective) {
    f << "collective " << c.ranks << " " << c.alpha << " " << c.beta << where(c, false) << "\n";
  }
  f << "p2p " << links.p2p.alpha << " " << links.p2p.beta << where(links.p2p, true) << "\n";
  for (const auto& c : links.p2p_strided) {
    if (c.stride != links.p2p.stride || c.phase != links.p2p.phase) {
      f << "p2p " << c.alpha << " " << c.beta << where(c, true) << "\n";
    }
  }
  if (!f) throw std::runtime_error("writing the profile " + path + " failed");
}

namespace {

// Optional trailing fields: stride=S (>= 1), for pairs phase=P (0 or 1, only
// with a stride), cpu=X (cores per rank while the transfer ran, 0 to 64),
// at=B:T,B:T,... (measured points, bytes growing).
bool read_place(std::istringstream& in, bool pair, LinkModel::Fit* f) {
  f->stride = f->phase = 0;
  f->cpu = 1;
  f->at_bytes.clear();
  f->at_seconds.clear();
  bool have_phase = false;
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    char* end = nullptr;
    if (key == "cpu") {
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v >= 0 && v <= 64)) return false;
      f->cpu = v;
      continue;
    }
    if (key == "at") {  // bytes:seconds,... with growing bytes, at most 64 points
      std::istringstream points(value);
      std::string point;
      while (std::getline(points, point, ',')) {
        const size_t colon = point.find(':');
        if (colon == std::string::npos || f->at_bytes.size() >= 64) return false;
        const std::string b = point.substr(0, colon), t = point.substr(colon + 1);
        char *eb = nullptr, *et = nullptr;
        const double bytes = std::strtod(b.c_str(), &eb), seconds = std::strtod(t.c_str(), &et);
        if (b.empty() || t.empty() || *eb != '\0' || *et != '\0' || !(bytes > 0 && bytes < 1e15) ||
            !(seconds >= 0 && seconds < 1e6) || (!f->at_bytes.empty() && bytes <= f->at_bytes.back())) {
          return false;
        }
        f->at_bytes.push_back(bytes);
        f->at_seconds.push_back(seconds);
      }
      if (f->at_bytes.size() < 2) return false;
      continue;
    }
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0') return false;
    if (key == "stride" && v >= 1 && v <= (1 << 20)) {
      f->stride = static_cast<int>(v);
    } else if (key == "phase" && pair && (v == 0 || v == 1)) {
      f->phase = static_cast<int>(v);
      have_phase = true;
    } else {
      return false;
    }
  }
  return !have_phase || f->stride > 0;
}

}  // namespace

void load_profile(const std::string& path, Profile* p, LinkModel* links) {
  const std::vector<uint8_t> bytes = read_input_file(path, size_t{1} << 20, "profile");
  std::istringstream f(std::string(bytes.begin(), bytes.end()));
  *p = Profile();
  *links = LinkModel();
  std::string line;
  int no = 0;
  bool have_p2p = false;
  while (std::getline(f, line)) {
    no++;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string key;
    in >> key;
    bool ok = true;
    auto finite = [&](double x) { ok = ok && std::isfinite(x) && x >= 0; };
    if (key == "cores") {
      in >> p->cores;
      ok = !in.fail() && p->cores >= 1;
    } else if (key == "update_per_param") {
      in >> p->update_per_param;
      finite(p->update_per_param);
    } else if (key == "micro") {
      MicroProfile m;
      in >> m.micro_batch >> m.layer_fwd >> m.layer_bwd >> m.embed_fb >> m.head_fb;
      ok = !in.fail() && m.micro_batch >= 1;
      for (double x : {m.layer_fwd, m.layer_bwd, m.embed_fb, m.head_fb}) finite(x);
      p->micro.push_back(m);
    } else if (key == "collective") {
      LinkModel::Fit c;
      in >> c.ranks >> c.alpha >> c.beta;
      ok = !in.fail() && c.ranks >= 2 && read_place(in, false, &c);
      finite(c.alpha);
      finite(c.beta);
      links->collective.push_back(c);
    } else if (key == "p2p") {
      LinkModel::Fit c;
      c.ranks = 2;
      in >> c.alpha >> c.beta;
      ok = !in.fail() && read_place(in, true, &c);
      finite(c.alpha);
      finite(c.beta);
      // The first p2p line is the default; every strided one is kept by stride.
      if (!have_p2p) links->p2p = c;
      if (c.stride > 0) links->p2p_strided.push_back(c);
      have_p2p = true;
    } else {
      ok = false;
    }
    if (!ok) throw std::runtime_error(path + ":" + std::to_string(no) + ": cannot read '" + line + "'");
  }
  if (p->micro.empty() || !have_p2p) { throw std::runtime_error(path + " lacks micro-batch timings or the p2p link"); }
}

}  // namespace meshtrain

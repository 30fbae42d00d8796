// meshccl_torch._C: creates meshccl process groups for torch.distributed.
// The Python package registers create_process_group as the "meshccl" backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <stdexcept>

#include "process_group.h"

namespace py = pybind11;

namespace meshccl_torch {
namespace {

// A communicator split off the world group for the next subgroup this process
// creates (torch only calls the backend's creator on the subgroup's members).
struct PendingSplit {
  ncclComm_t comm = nullptr;
  int rank = -1;
  int size = 0;
};
std::mutex g_pending_mu;
PendingSplit g_pending;

void clear_pending_split() {
  std::lock_guard<std::mutex> lock(g_pending_mu);
  if (g_pending.comm != nullptr) (void)ncclCommDestroy(g_pending.comm);
  g_pending = PendingSplit{};
}

// Rethrows c10 errors without their C++ backtrace: Python shows the message.
template <typename F>
auto plain_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) { throw std::runtime_error(e.what_without_backtrace()); }
}

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::milliseconds timeout) {
  return plain_errors([&]() -> c10::intrusive_ptr<c10d::ProcessGroup> {
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_pending_mu);
      if (g_pending.comm != nullptr && g_pending.rank == rank && g_pending.size == size) {
        comm = g_pending.comm;
        g_pending = PendingSplit{};
      }
    }
    if (comm != nullptr) return track(c10::make_intrusive<ProcessGroupMeshccl>(comm, rank, size, timeout));
    return track(c10::make_intrusive<ProcessGroupMeshccl>(store, rank, size, timeout));
  });
}

// Collective over `parent` (a meshccl group): every rank calls it, members with
// member=true. Returns false when `parent` is not a meshccl group.
bool split_for_next_group(const c10::intrusive_ptr<c10d::ProcessGroup>& parent, bool member, int key,
                          std::chrono::milliseconds timeout) {
  auto* pg = dynamic_cast<ProcessGroupMeshccl*>(parent.get());
  if (pg == nullptr) return false;
  clear_pending_split();
  ncclComm_t child = plain_errors([&] { return pg->split(member ? 0 : -1, key, timeout); });
  if (child == nullptr) return true;
  int rank = -1, size = 0;
  if (ncclCommUserRank(child, &rank) != ncclSuccess || ncclCommCount(child, &size) != ncclSuccess) {
    (void)ncclCommDestroy(child);
    throw std::runtime_error("meshccl: the communicator split off for a new group does not answer");
  }
  std::lock_guard<std::mutex> lock(g_pending_mu);
  g_pending = PendingSplit{child, rank, size};
  return true;
}

// (rank, size, local rank) from the launcher's variables, or None.
py::object launch_info() {
  int rank = -1, size = 0, local = -1;
  if (meshcclGetLaunchInfo(&rank, &size, &local) != ncclSuccess || size <= 0) return py::none();
  return py::make_tuple(rank, size, local);
}

}  // namespace
}  // namespace meshccl_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "meshccl process groups for torch.distributed";
  py::module::import("torch.distributed");  // registers c10d's Store and ProcessGroup types
  m.def("create_process_group", &meshccl_torch::create_process_group, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "Creates a meshccl process group (the creator registered for backend \"meshccl\").");
  m.def("split_for_next_group", &meshccl_torch::split_for_next_group, py::arg("parent"), py::arg("member"),
        py::arg("key"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "ncclCommSplit of a meshccl group for the next new group; every rank of the parent calls it.");
  m.def("clear_pending_split", &meshccl_torch::clear_pending_split, py::call_guard<py::gil_scoped_release>());
  m.def("shutdown_all", &meshccl_torch::shutdown_all, py::call_guard<py::gil_scoped_release>(),
        "Settles the work of every live meshccl group (at interpreter exit, before tensors are freed).");
  m.def("launch_info", &meshccl_torch::launch_info,
        "(rank, size, local_rank) as meshrun, mpirun, mpiexec or srun set them; None without a launcher.");
  m.attr("NCCL_VERSION_CODE") = NCCL_VERSION_CODE;
  m.attr("MESHCCL_VERSION_CODE") = MESHCCL_VERSION_CODE;
}

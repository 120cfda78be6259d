#pragma once
// How mesh ranks learn each other's addresses: rank, size and an allgather.
//  - standalone: rank 0 listens on --root HOST:PORT (TCP) and relays;
//    a rank that died shows as a missing entry instead of a hang;
//  - PMIx: the launcher's server (mpirun, srun) does it (PMIx_Put, Commit,
//    Fence with data collection, Get), as MPI and UCX bootstrap.
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mesh {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* name() const = 0;
  // Every rank's string, by rank; nullopt for a rank that is gone.
  virtual std::vector<std::optional<std::string>> allgather(const std::string& mine) = 0;

 protected:
  int rank_ = 0;
  int size_ = 1;
};

std::unique_ptr<Bootstrap> standalone_bootstrap(int rank, int size,
                                                const std::string& root);
// nullptr if this process was not started by a PMIx launcher (or the tool
// was built without PMIx); throws if PMIx_Init fails under one.
std::unique_ptr<Bootstrap> pmix_bootstrap();

}  // namespace mesh

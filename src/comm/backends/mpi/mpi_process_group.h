// The mpi backend: ProcessGroup calls mapped onto an MPI library's own collectives
// (MPI_Iallreduce, ...), run on the group's Engine and polled with MPI_Test until the call's
// deadline. Ranks and size come from MPI_COMM_WORLD, so ranks started by mpirun need no
// other configuration. bf16/f16 reductions use user-defined MPI ops that add in f32.
// Limits: counts must fit an int; no rank-ordered (deterministic) mode; a dead rank is
// handled by the MPI runtime (OpenMPI's mpirun aborts the job).
#pragma once

#include <memory>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm::mpi {

// Initialises MPI (MPI_THREAD_SERIALIZED at least) if nobody has; finalised at exit.
std::shared_ptr<ProcessGroup> create_mpi_process_group(const ProcessGroupOptions& options);

}  // namespace paratrain::comm::mpi

// OpenMPI's MPI_Allreduce (f32 sum), the peer paratrain's all-reduce is compared with in
// bench/comm_allreduce.sh. Run under mpirun: comm_mpi_allreduce_bench [min_bytes max_bytes iters].
// Prints: bytes time_us busbw_gbps (nccl-tests busbw = algbw * 2(n-1)/n).
#include <cstdio>
#include <cstdlib>
#include <vector>
#if PARATRAIN_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t lo = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096;
  size_t hi = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (64u << 20);
  int iters = argc > 3 ? std::atoi(argv[3]) : 20;
  for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
    size_t count = bytes / 4;
    std::vector<float> a(count, 1.0f), b(count);
    int it = bytes <= (1u << 20) ? iters * 50 : iters;
    for (int i = 0; i < 3; ++i) MPI_Allreduce(a.data(), b.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < it; ++i) MPI_Allreduce(a.data(), b.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / it, tmax;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) std::printf("%zu %.2f %.3f\n", bytes, tmax * 1e6, bytes / tmax / 1e9 * 2.0 * (n - 1) / n);
  }
  MPI_Finalize();
  return 0;
}
#else
int main() {
  std::puts("comm_mpi_allreduce_bench: built without MPI");
  return 0;
}
#endif

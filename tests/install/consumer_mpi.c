/*
 * consumer_mpi.c — a program outside the tree that asks for ranks: it links
 * libmlo-mpi (mlo/mpi.h) as well as libmlo, and wraps its MPI job in an mlo
 * communicator.  Built by scripts/install-check.sh through pkg-config
 * (mlo-mpi) and find_package(mlo COMPONENTS mpi), and run as a singleton job
 * (one rank).  Prints "consumer ok" and exits 0 only if every step did what
 * it should.
 */
#include <mlo/mlo.h>
#include <mlo/mpi.h>

#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  char err[256] = "";
  mlo_comm *comm = NULL;
  int rc = mlo_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm, err, sizeof err);
  int ok = rc == MLO_OK && mlo_comm_rank(comm) == 0 && mlo_comm_size(comm) == 1 &&
           mlo_comm_node_size(comm) == 1;
  mlo_comm_free(comm);
  MPI_Finalize();
  if (!ok) {
    fprintf(stderr, "consumer_mpi: %s %s\n", mlo_err_name(rc), err);
    return 1;
  }
  printf("consumer ok: mlo %s with libmlo-mpi, rank 0 of 1\n", mlo_version());
  return 0;
}

/*
 * The pod sandbox's pause process for the real-node end-to-end stage (scripts/real-nodes.sh),
 * after Kubernetes' build/pause/linux/pause.c (Apache-2.0): it holds the pod's namespaces, reaps
 * the zombies it inherits as PID 1, and exits on SIGINT or SIGTERM. Built statically and packaged
 * by scripts/oci-image.py --pause, so no registry is needed.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void sigdown(int signo) {
  psignal(signo, "Shutting down, got signal");
  exit(0);
}

static void sigreap(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause (ebbflow tests/cluster/pause)\n");
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "Warning: pause should be the first process\n");
  }
  struct sigaction down = {.sa_handler = sigdown};
  struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
      sigaction(SIGCHLD, &reap, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
  fprintf(stderr, "Error: infinite loop terminated\n");
  return 42;
}

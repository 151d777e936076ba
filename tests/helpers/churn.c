/* Processes coming and going: forks RATE children a second for SECONDS seconds, each
 * living 20 ms (nanosleep, then _exit), reaps them, and prints how many it forked.
 * Dies with its parent (PR_SET_PDEATHSIG), and its children outlive it by 20 ms at most.
 * Built by tests/serve.rs:  churn RATE SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    double rate = atof(argv[1]), secs = atof(argv[2]);
    if (rate <= 0 || secs <= 0) return 2;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    double start = now(), next = start;
    long forked = 0;
    struct timespec life = {0, 20 * 1000 * 1000};
    while (now() - start < secs) {
        pid_t pid = fork();
        if (pid == 0) {
            nanosleep(&life, NULL);
            _exit(0);
        }
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        forked++;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        next += 1.0 / rate;
        double wait = next - now();
        if (wait > 0) {
            struct timespec d = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
            nanosleep(&d, NULL);
        }
    }
    while (wait(NULL) > 0) {
    }
    printf("%ld\n", forked);
    return 0;
}

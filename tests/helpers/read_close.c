/* A copying loader in C: read() the whole file into a heap buffer, close it, say
 * "ready", and hold the copy until stdin closes. Built by tests/exact/truth/mod.rs. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return 1;
    struct stat st;
    if (fstat(fd, &st) != 0) return 1;
    char *buf = malloc(st.st_size);
    if (!buf) return 1;
    off_t done = 0;
    while (done < st.st_size) {
        ssize_t n = read(fd, buf + done, st.st_size - done);
        if (n <= 0) return 1;
        done += n;
    }
    close(fd);
    write(1, "ready\n", 6);
    char c;
    while (read(0, &c, 1) > 0) {}
    free(buf);
    return 0;
}

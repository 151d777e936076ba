//! The container image (`Dockerfile`), built and run here.
//!
//! No base image can be pulled on these machines, so the test assembles the base from a
//! local root file system with buildah (the libraries `ldd` names for the binary, which is
//! what `gcr.io/distroless/cc-debian12` provides), builds the Dockerfile's final stage on
//! it as written (only its `COPY --from=build` takes the binary cargo built for this test),
//! inspects the image, then runs it with podman with the DaemonSet's flags (host PID
//! namespace, read-only root, every capability dropped but the five it adds, no new
//! privileges, `/sys` read-only) and scrapes `/metrics`: the copy count of a model two
//! readers hold (a private copy and a mapping) must be 2 from inside the container.
//!
//! Measured on this VM (Debian 12, podman 4.3): crun refuses the hybrid cgroup layout
//! ("cgroups in hybrid mode not supported"), so the test runs runc; the shell has no
//! CAP_SYS_RESOURCE, so podman's default rlimits cannot be set and the test passes its
//! own (`--ulimit`), the highest runc could set here.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{
    exe, file_id, free_port, have, in_ci, is_root, model_file, reader, require, MIB,
};

/// What the test made in podman's storage, removed when dropped (by name).
struct Made {
    containers: Vec<String>,
    images: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = Command::new("podman").args(["rm", "-f", "-i", c]).output();
        }
        for i in &self.images {
            let _ = Command::new("podman").args(["rmi", "-f", "-i", i]).output();
        }
    }
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The shared libraries `ldd` lists for `bin` (the loader included).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = run(Command::new("ldd").arg(bin)).unwrap();
    out.lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from)
        .collect()
}

/// The Dockerfile's final stage (from its `ARG BASE` on, and after the last `FROM`), the
/// binary taken from the build context instead of the build stage.
fn final_stage() -> String {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let arg = text
        .lines()
        .find(|l| l.starts_with("ARG BASE="))
        .expect("Dockerfile: ARG BASE");
    let last_from = text
        .rfind("\nFROM ${BASE}")
        .expect("Dockerfile: FROM ${BASE}");
    let stage = &text[last_from + 1..];
    let from_build = "COPY --from=build /out/twofold /usr/local/bin/twofold";
    assert_eq!(stage.matches(from_build).count(), 1, "{stage}");
    format!(
        "{arg}\n{}",
        stage.replace(from_build, "COPY twofold /usr/local/bin/twofold")
    )
}

fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain; version=0.0.4\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn sum(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_image_builds_and_counts_from_inside_a_container() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (podman's storage, the proof)")
        || !require(have("buildah"), "buildah (apt install buildah)")
        || !require(have("podman"), "podman (apt install podman)")
        || !require(have("runc"), "runc (apt install runc)")
    {
        return;
    }
    let tag = format!("twofold-test-{}", std::process::id());
    let base = format!("localhost/{tag}-base:latest");
    let image = format!("localhost/{tag}:latest");
    let mut made = Made {
        containers: Vec::new(),
        images: Vec::new(),
    };

    // The base: the libraries the binary links, at their paths.
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    let bin = exe();
    let libs = libraries(&bin);
    assert!(
        libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
        "{libs:?}"
    );
    for lib in &libs {
        let to = rootfs.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(lib, &to).unwrap();
    }
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").unwrap();
    let ctr = run(Command::new("buildah").args(["from", "--name", &format!("{tag}-b"), "scratch"]))
        .unwrap();
    let committed = run(Command::new("buildah")
        .args(["copy", &ctr])
        .arg(format!("{}/", rootfs.display()))
        .arg("/"))
    .and_then(|_| run(Command::new("buildah").args(["commit", "--rm", "-q", &ctr, &base])));
    made.images.push(base.clone());
    if committed.is_err() {
        let _ = run(Command::new("buildah").args(["rm", &ctr]));
    }
    committed.unwrap();

    // The Dockerfile's final stage on it.
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::copy(&bin, ctx.join("twofold")).unwrap();
    std::fs::write(ctx.join("Dockerfile"), final_stage()).unwrap();
    made.images.push(image.clone());
    run(Command::new("buildah")
        .args(["bud", "-q", "--layers=false", "--build-arg"])
        .arg(format!("BASE={base}"))
        .args(["-t", &image, "-f"])
        .arg(ctx.join("Dockerfile"))
        .arg(&ctx))
    .unwrap();

    // What the image says about itself.
    let inspect: serde_json::Value = serde_json::from_str(
        &run(Command::new("podman").args(["image", "inspect", &image])).unwrap(),
    )
    .unwrap();
    let cfg = &inspect[0]["Config"];
    assert_eq!(
        cfg["Entrypoint"],
        serde_json::json!(["/usr/local/bin/twofold"]),
        "{cfg}"
    );
    assert_eq!(cfg["Cmd"][0], "serve", "{cfg}");
    assert_eq!(cfg["User"], "0:0", "{cfg}");
    assert!(cfg["ExposedPorts"].get("9464/tcp").is_some(), "{cfg}");
    assert_eq!(
        cfg["Labels"]["org.opencontainers.image.title"], "twofold",
        "{cfg}"
    );
    let size = inspect[0]["Size"].as_u64().unwrap();
    let libs_bytes: u64 = libs
        .iter()
        .map(|l| std::fs::metadata(l).unwrap().len())
        .sum();
    let bin_bytes = std::fs::metadata(&bin).unwrap().len();
    assert!(
        size <= bin_bytes + libs_bytes + MIB,
        "the image is the binary and its libraries: {size} bytes for {bin_bytes} + {libs_bytes}"
    );
    eprintln!(
        "image {image}: {:.1} MiB (binary {:.1} MiB, {} libraries {:.1} MiB)",
        size as f64 / MIB as f64,
        bin_bytes as f64 / MIB as f64,
        libs.len(),
        libs_bytes as f64 / MIB as f64
    );

    // Two readers of a model on the host: a private copy and a mapping.
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "model.safetensors", 16 * MIB);
    // Another user's file, mode 0600: uid 0 in the container reads it and its page cache
    // only through the capabilities the DaemonSet adds (DAC_READ_SEARCH, FOWNER).
    std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let _copy = reader("copy", Some(&file), &["--close"]);
    let _map = reader("map", Some(&file), &[]);
    let id = file_id(&file);

    let port = free_port();
    // SAFETY: getrlimit only writes the struct it is given.
    let nofile = unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    };
    let name = format!("{tag}-serve");
    made.containers.push(name.clone());
    let started = run(Command::new("podman")
        .args(["run", "-d", "--name", &name, "--runtime", "runc"])
        // The DaemonSet's pod: host PIDs, read-only root, four capabilities, /sys read-only.
        .args([
            "--pid=host",
            "--read-only",
            "--security-opt=no-new-privileges",
        ])
        .args([
            "--cap-drop=ALL",
            "--cap-add=SYS_PTRACE,DAC_READ_SEARCH,FOWNER,BPF,PERFMON",
        ])
        .args(["-v", "/sys:/sys:ro"])
        // The pod network is not what is tested: the host's, to reach it on loopback.
        .arg("--network=host")
        .arg(format!("--ulimit=nofile={nofile}:{nofile}"))
        .arg("--ulimit=nproc=32768:32768")
        .arg(&image)
        .args([
            "serve",
            &format!("--listen=127.0.0.1:{port}"),
            "--interval=1s",
        ])
        .arg("--prove-budget=30s"));
    let container = match started {
        Ok(c) => c,
        Err(why) => {
            assert!(!in_ci(), "podman cannot run the image: {why}");
            println!("SKIPPED: podman cannot run a container here (the image built and was inspected): {why}");
            return;
        }
    };
    // From inside the container: page cache (1) + the reader's private copy (1) = 2.
    // Another process of this host may hold more (the test binary's own heap): the readers'
    // count is the exporter's less what others than `twofold __child` hold, as in
    // tests/exact/serve.rs.
    let until = Instant::now() + Duration::from_secs(180);
    let mut last = String::new();
    let readers = loop {
        if let Ok((200, body)) = get(port, "/metrics") {
            let c = value(&body, "twofold_file_copies", &[("file_id", &id)]);
            let size = value(&body, "twofold_file_size_bytes", &[("file_id", &id)]);
            if let (Some(c), Some(size)) = (c, size) {
                let kind = ("kind", "private_copy_proven");
                let all = sum(
                    &body,
                    "twofold_workload_file_held_bytes",
                    &[("file_id", &id), kind],
                );
                let ours = sum(
                    &body,
                    "twofold_workload_file_held_bytes",
                    &[("workload", "twofold"), ("file_id", &id), kind],
                );
                let r = c - (all - ours) / size;
                if (r - 2.0).abs() < 0.01 {
                    break r;
                }
            }
            last = body;
        }
        if Instant::now() > until {
            let logs = run(Command::new("podman").args(["logs", &container])).unwrap_or_else(|e| e);
            panic!("the container never counted 2 copies of {id}; logs: {logs}\nlast:\n{last}");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(get(port, "/healthz").unwrap().0, 200);
    eprintln!("from inside the container: {readers} copies of {id}");
}

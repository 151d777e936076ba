//! The systemd units of `deploy/`, for real: the test reads a unit's user, capabilities and
//! file-system sandbox and runs its `ExecStart` under them (systemd does not run here, so
//! with `unshare --mount` and `setpriv`), then checks that the count is known.
//!
//! Applied from the unit: `DynamicUser=`/`User=` (a fresh uid and gid from systemd's
//! dynamic range, no supplementary groups), `CapabilityBoundingSet=`,
//! `AmbientCapabilities=`, `NoNewPrivileges=`, `ProtectSystem=strict` (every mount
//! read-only but /proc, /sys and /dev), `ProtectHome=read-only`, `PrivateTmp=` (a private
//! /tmp and /var/tmp, so the model file in the test's /tmp is reachable only through
//! /proc/PID/root). Not applied (they take systemd itself): the system-call filter,
//! `MemoryDenyWriteExecute=`, `RestrictNamespaces=`, `RestrictAddressFamilies=`,
//! `IPAddress*=`, `Protect{Kernel*,Clock,Hostname,ControlGroups}=`, resource limits.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    exe, file_id, free_port, have, is_root, model_file, reader, require, tolerance, MIB,
};

/// The `[Service]` settings of a unit (a key given twice keeps both values, joined by a
/// space, as systemd does for lists).
fn service(unit: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join(unit),
    )
    .unwrap();
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut in_service = false;
    for l in text.lines().map(str::trim) {
        if l.starts_with('[') {
            in_service = l == "[Service]";
            continue;
        }
        if !in_service || l.starts_with('#') || l.is_empty() {
            continue;
        }
        let (k, v) = l.split_once('=').unwrap();
        out.entry(k.to_string())
            .and_modify(|e| {
                e.push(' ');
                e.push_str(v);
            })
            .or_insert_with(|| v.to_string());
    }
    out
}

/// `CAP_SYS_PTRACE CAP_FOWNER` → `+sys_ptrace,+fowner` (setpriv's spelling).
fn caps(list: &str) -> String {
    list.split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A uid and gid from systemd's dynamic range (61184–65519) that /etc/passwd and
/// /etc/group do not use.
fn dynamic_user() -> u32 {
    let used = |f: &str| -> Vec<u32> {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(':').nth(2)?.parse().ok())
            .collect()
    };
    let (u, g) = (used("/etc/passwd"), used("/etc/group"));
    (61184 + std::process::id() % 4000..65519)
        .find(|id| !u.contains(id) && !g.contains(id))
        .unwrap()
}

/// Mount points, decoded (`\040` is a space), outside /proc, /sys and /dev.
fn mount_points() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut v: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| {
            m.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\134", "\\")
        })
        .filter(|m| {
            !["/proc", "/sys", "/dev"]
                .iter()
                .any(|p| m == p || m.starts_with(&format!("{p}/")))
        })
        .collect();
    v.sort_by_key(|m| m.matches('/').count());
    v.dedup();
    v
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The unit's `ExecStart` (binary replaced by the one cargo built, `replace` applied to
/// its arguments) under its user, capabilities and file-system sandbox.
fn start(unit: &BTreeMap<String, String>, replace: &[(&str, &str)]) -> (Child, u32) {
    let mut sh = vec!["set -e".to_string()];
    let private_tmp = unit.get("PrivateTmp").map(String::as_str) == Some("yes");
    let mut bin = exe();
    if private_tmp && (bin.starts_with("/tmp") || bin.starts_with("/var/tmp")) {
        // A checkout under /tmp (a fresh clone, say): the unit's private /tmp hides the
        // binary's path, so the shell works in its directory (still reachable as the
        // working directory once hidden) and runs it by a relative path.
        let dir = bin.parent().unwrap().display().to_string();
        sh.push(format!("cd {}", quote(&dir)));
        bin = Path::new(".").join(bin.file_name().unwrap());
    }
    if unit.get("ProtectSystem").map(String::as_str) == Some("strict") {
        for m in mount_points() {
            sh.push(format!("mount -o remount,bind,ro {}", quote(&m)));
        }
    }
    if unit.get("ProtectHome").map(String::as_str) == Some("read-only") {
        for h in ["/home", "/root", "/run/user"] {
            if Path::new(h).is_dir() {
                sh.push(format!(
                    "mount --bind {h} {h}; mount -o remount,bind,ro {h}"
                ));
            }
        }
    }
    if private_tmp {
        sh.push("mount -t tmpfs -o mode=1777 tmpfs /tmp".into());
        sh.push("mount -t tmpfs -o mode=1777 tmpfs /var/tmp".into());
    }
    let id = match (unit.get("DynamicUser"), unit.get("User")) {
        (Some(y), _) if y == "yes" => dynamic_user(),
        (_, Some(u)) if u == "root" => 0,
        other => panic!("unit user {other:?}"),
    };
    let bounding = unit.get("CapabilityBoundingSet").map(|c| caps(c)).unwrap();
    let ambient = unit.get("AmbientCapabilities").map(|c| caps(c)).unwrap();
    let mut setpriv = vec![
        "exec setpriv".to_string(),
        format!("--reuid={id} --regid={id} --clear-groups"),
        format!("--bounding-set=-all,{bounding}"),
        format!("--inh-caps=-all,{ambient} --ambient-caps=-all,{ambient}"),
    ];
    if unit.get("NoNewPrivileges").map(String::as_str) == Some("yes") {
        setpriv.push("--no-new-privs".into());
    }
    let exec = unit.get("ExecStart").unwrap();
    let mut args: Vec<String> = exec
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect();
    for (from, to) in replace {
        let at = args
            .iter()
            .position(|a| a == from)
            .unwrap_or_else(|| panic!("{exec}: {from}"));
        args[at] = to.to_string();
    }
    setpriv.push("--".into());
    setpriv.push(quote(&bin.display().to_string()));
    setpriv.extend(args.iter().map(|a| quote(a)));
    sh.push(setpriv.join(" "));
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(sh.join("\n"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, id)
}

fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
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
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A `/proc/PID/status` line's value.
fn status(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| Some(l.strip_prefix(&format!("{key}:"))?.trim().to_string()))
        .unwrap()
}

#[test]
fn the_serve_unit_counts_under_its_own_sandbox() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (to set up the unit's user and sandbox)")
        || !require(
            have("setpriv") && have("unshare"),
            "util-linux setpriv and unshare",
        )
    {
        return;
    }
    let unit = service("twofold-serve.service");
    // A model file of root's, mode 0600, mapped by a root process: nothing but the
    // unit's capabilities lets a dynamic user read it or its page-cache state.
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "model.safetensors", 8 * MIB);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let _map = reader("map", Some(&file), &[]);
    let id = file_id(&file);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (mut child, uid) = start(&unit, &[("127.0.0.1:9464", &listen), ("15s", "1s")]);
    let pid = child.id();
    let until = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    let body = loop {
        if let Ok((200, b)) = get(port, "/metrics") {
            if value(&b, "twofold_file_copies", &[("file_id", &id)]).is_some() {
                break b;
            }
            last = b;
        }
        if let Ok(Some(rc)) = child.try_wait() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("the unit's serve exited ({rc}): {err}");
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no count of {id} under the unit's sandbox; last exposition:\n{last}");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // It ran as the unit says.
    assert_eq!(
        status(pid, "Uid").split_whitespace().next(),
        Some(uid.to_string().as_str())
    );
    assert_eq!(status(pid, "NoNewPrivs"), "1");
    let eff = u64::from_str_radix(&status(pid, "CapEff"), 16).unwrap();
    // CAP_SYS_PTRACE 19, CAP_DAC_READ_SEARCH 2, CAP_FOWNER 3, CAP_PERFMON 38, CAP_BPF 39.
    let want = [19u32, 2, 3, 38, 39].iter().fold(0u64, |m, c| m | 1 << c);
    assert_eq!(eff, want, "CapEff {eff:x}");
    let _ = child.kill();
    let _ = child.wait();

    // The page cache is known (the mapping made it all resident) and so is the count.
    let size = (8 * MIB) as f64;
    let pc = value(
        &body,
        "twofold_file_held_bytes",
        &[("file_id", &id), ("kind", "page_cache")],
    )
    .unwrap_or_else(|| panic!("page cache unknown:\n{body}"));
    assert!(
        (pc - size).abs() <= tolerance(8 * MIB) as f64,
        "page cache {pc}"
    );
    let copies = value(&body, "twofold_file_copies", &[("file_id", &id)]).unwrap();
    assert!(copies >= 1.0 - 1e-9, "copies {copies}");
    eprintln!("under the unit's sandbox (uid {uid}): page cache {pc} bytes, {copies} copies");
}

/// `systemd-analyze security` rates both units OK (at most 3.0); they were 5.6 and 6.5
/// (MEDIUM) before.
#[test]
fn systemd_analyze_rates_the_units_ok() {
    let _group = crate::common::group(module_path!());
    if !require(have("systemd-analyze"), "systemd-analyze (systemd)") {
        return;
    }
    for unit in ["twofold-serve.service", "twofold-record.service"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join(unit);
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--no-pager"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let score: f64 = text
            .lines()
            .find_map(|l| {
                l.split("service: ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{unit}: {text}{}", String::from_utf8_lossy(&out.stderr)));
        eprintln!("{unit}: exposure {score}");
        assert!(score <= 3.0, "{unit}: exposure {score}");
        // The page-cache capability is in both (without it residency is unknown).
        let s = service(unit);
        assert!(s["AmbientCapabilities"].contains("CAP_FOWNER"), "{unit}");
        assert!(
            !s["CapabilityBoundingSet"].contains("CAP_DAC_OVERRIDE"),
            "{unit}"
        );
    }
}

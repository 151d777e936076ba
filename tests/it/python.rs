//! The Python wheel (#45, docs/python.md): `scripts/python-tests.sh` builds it with
//! maturin from PyPI, installs it into a fresh virtualenv with NumPy and pytest, and runs
//! `tests/python/` there (the API against fincore, `twofold.expect`, the pytest plugin,
//! the wheel's contents). Its output is printed whole; its last line sums it up.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use crate::common::{have, require};

#[test]
fn python_wheel_builds_installs_and_passes_its_tests() {
    if !require(
        have("python3")
            && Command::new("python3")
                .args(["-m", "venv", "-h"])
                .output()
                .is_ok_and(|o| o.status.success()),
        "python3 with venv",
    ) {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(repo.join("scripts/python-tests.sh"))
        .current_dir(repo)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "scripts/python-tests.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or("");
    assert!(last.starts_with("python-tests: ok: "), "{last}");
    assert!(
        !last.contains("failed") && !last.contains("error") && !last.contains("skipped"),
        "every test of tests/python ran and passed: {last}"
    );
}

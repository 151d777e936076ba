//! `--web.config.file`: a real TLS listener (a self-signed certificate openssl made in a
//! temp dir) and basic authentication (bcrypt hashes made by Python's `bcrypt`, an
//! implementation other than ours), tested with curl: the right password gets the
//! exposition, a wrong one or none gets 401, plain HTTP gets no exposition, and a bad file
//! is one line naming it, exit 2.

use super::*;

/// `curl` over HTTPS trusting `cert`: (HTTP code, body, headers).
fn curl(cert: &Path, url: &str, user: Option<&str>) -> (u16, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let headers = dir.path().join("h");
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "--max-time", "20", "-w", "\n%{http_code}"])
        .arg("--cacert")
        .arg(cert)
        .arg("-D")
        .arg(&headers)
        .args(["-H", "Accept: application/openmetrics-text; version=1.0.0"])
        .arg(url);
    if let Some(u) = user {
        c.args(["-u", u]);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let h = std::fs::read_to_string(&headers).unwrap_or_default();
    (code.trim().parse().unwrap_or(0), body.to_string(), h)
}

fn bcrypt_hash(password: &str) -> Option<String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, bcrypt; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=6)).decode().replace('$2b$', '$2y$', 1))",
            password,
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn tls_and_basic_auth_from_a_web_config_file() {
    let _group = crate::common::group(super::GROUP);
    let hash = bcrypt_hash("s3cret");
    if !require(have("openssl"), "openssl")
        || !require(have("curl"), "curl")
        || !require(hash.is_some(), "python3 bcrypt (pip install bcrypt)")
    {
        return;
    }
    let hash = hash.unwrap();
    let _live = live();
    let dir = tempfile::tempdir().unwrap();
    crate::common::run_ok(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=twofold-test"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .args(["-keyout", "key.pem", "-out", "cert.pem"])
            .current_dir(dir.path()),
    );
    // Relative paths: relative to the file's directory.
    let config = dir.path().join("web.yml");
    std::fs::write(
        &config,
        format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS12\nbasic_auth_users:\n  alice: {hash}\n"
        ),
    )
    .unwrap();
    let models = tempfile::tempdir().unwrap();
    model_file(models.path(), "model.safetensors", MIB);
    let glob = models.path().join("*.safetensors").display().to_string();
    let port = free_port();
    let _serve = Proc(
        Command::new(exe())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--interval", "1s", "--no-prove", "--model-glob", &glob])
            .arg("--web.config.file")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let cert = dir.path().join("cert.pem");
    let url = format!("https://127.0.0.1:{port}/metrics");
    let until = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let (code, body, _) = curl(&cert, &url, Some("alice:s3cret"));
        if code == 200 && body.contains("twofold_file_info{") {
            break body;
        }
        assert!(
            Instant::now() < until,
            "no exposition over TLS: {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(body.ends_with("# EOF\n"), "{body}");
    for (user, what) in [
        (Some("alice:wrong"), "a wrong password"),
        (Some("bob:s3cret"), "an unknown user"),
        (None, "no credentials"),
    ] {
        let (code, body, headers) = curl(&cert, &url, user);
        assert_eq!(code, 401, "{what}: {body}");
        assert!(!body.contains("twofold_"), "{what}: {body}");
        assert!(
            headers
                .to_ascii_lowercase()
                .contains("www-authenticate: basic"),
            "{what}: {headers}"
        );
    }
    let (code, _, _) = curl(
        &cert,
        &format!("https://127.0.0.1:{port}/healthz"),
        Some("alice:s3cret"),
    );
    assert_eq!(code, 200);
    // Plain HTTP on the TLS port: no exposition.
    let plain = get(port, "/metrics", None);
    assert!(
        !plain
            .as_ref()
            .is_ok_and(|(c, b)| *c == 200 || b.contains("twofold_")),
        "plain HTTP answered: {plain:?}"
    );

    // A bad file: one line naming it, exit 2.
    let bad = dir.path().join("bad.yml");
    std::fs::write(
        &bad,
        "tls_server_config:\n  cert_file: missing.pem\n  key_file: key.pem\n",
    )
    .unwrap();
    let out = Command::new(exe())
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--web.config.file")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("missing.pem") && err.contains("bad.yml"),
        "{err}"
    );
}

//! `--web.config.file`: the exporter-toolkit file node_exporter reads, the part of it that
//! applies here: TLS (`tls_server_config`: `cert_file`, `key_file`, `min_version`,
//! `client_auth_type: NoClientCert`) and basic authentication (`basic_auth_users`:
//! user → bcrypt hash). Relative paths are relative to the file's directory, as there.
//! Keys it does not know are refused with their name, rather than silently ignored
//! (`client_ca_file` and client certificates, `http_server_config`, cipher choices).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use yaml_rust2::{Yaml, YamlLoader};

/// What the web config file asks for.
#[derive(Debug, Default)]
pub struct WebConfig {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub users: BTreeMap<String, String>,
}

fn keys<'a>(y: &'a Yaml, what: &str, allowed: &[&str]) -> anyhow::Result<Vec<(&'a str, &'a Yaml)>> {
    let Yaml::Hash(h) = y else {
        bail!("{what} is not a mapping");
    };
    h.iter()
        .map(|(k, v)| {
            let k = k
                .as_str()
                .ok_or_else(|| anyhow!("{what}: a key is not a string"))?;
            if !allowed.contains(&k) {
                bail!(
                    "{what}: '{k}' is not supported (supported: {})",
                    allowed.join(", ")
                );
            }
            Ok((k, v))
        })
        .collect()
}

fn string<'a>(v: &'a Yaml, what: &str) -> anyhow::Result<&'a str> {
    v.as_str().ok_or_else(|| anyhow!("{what} is not a string"))
}

/// Reads and checks `path` (certificates and key loaded, every hash a bcrypt hash).
pub fn load(path: &Path) -> anyhow::Result<WebConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the web config '{}'", path.display()))?;
    parse(&text, path.parent().unwrap_or(Path::new(".")))
        .with_context(|| format!("web config '{}'", path.display()))
}

/// Parses a web config whose relative paths are relative to `dir`.
pub fn parse(text: &str, dir: &Path) -> anyhow::Result<WebConfig> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| anyhow!("not YAML: {e}"))?;
    let mut cfg = WebConfig::default();
    let Some(doc) = docs.first() else {
        return Ok(cfg);
    };
    if matches!(doc, Yaml::Null) {
        return Ok(cfg);
    }
    for (k, v) in keys(doc, "the file", &["tls_server_config", "basic_auth_users"])? {
        match k {
            "tls_server_config" => cfg.tls = Some(Arc::new(tls(v, dir)?)),
            _ => {
                if matches!(v, Yaml::Null) {
                    continue;
                }
                for (user, hash) in users(v)? {
                    let hash = string(hash, &format!("basic_auth_users: '{user}'"))?;
                    bcrypt_hash(hash).with_context(|| format!("basic_auth_users: '{user}'"))?;
                    cfg.users.insert(user.to_string(), hash.to_string());
                }
            }
        }
    }
    Ok(cfg)
}

/// The entries of `basic_auth_users` (any user name is a key).
fn users(v: &Yaml) -> anyhow::Result<Vec<(&str, &Yaml)>> {
    let Yaml::Hash(h) = v else {
        bail!("basic_auth_users is not a mapping of user to bcrypt hash");
    };
    h.iter()
        .map(|(k, v)| {
            Ok((
                k.as_str()
                    .ok_or_else(|| anyhow!("basic_auth_users: a user is not a string"))?,
                v,
            ))
        })
        .collect()
}

/// A hash bcrypt can check (`$2a$`, `$2b$`, `$2x$`, `$2y$`, cost and 53 characters).
fn bcrypt_hash(h: &str) -> anyhow::Result<()> {
    h.parse::<bcrypt::HashParts>()
        .map(|_| ())
        .map_err(|e| anyhow!("not a bcrypt hash ({e})"))
}

fn tls(v: &Yaml, dir: &Path) -> anyhow::Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut cert = None;
    let mut key = None;
    let mut min = &rustls::version::TLS12;
    let entries = keys(
        v,
        "tls_server_config",
        &["cert_file", "key_file", "min_version", "client_auth_type"],
    )?;
    for (k, v) in entries {
        let s = string(v, &format!("tls_server_config: {k}"))?;
        match k {
            "cert_file" => cert = Some(dir.join(s)),
            "key_file" => key = Some(dir.join(s)),
            "min_version" => {
                min = match s {
                    "TLS12" => &rustls::version::TLS12,
                    "TLS13" => &rustls::version::TLS13,
                    other => bail!("tls_server_config: min_version '{other}' (TLS12 or TLS13)"),
                }
            }
            _ if s == "NoClientCert" => {}
            _ => bail!(
                "tls_server_config: client_auth_type '{s}' is not supported (NoClientCert only)"
            ),
        }
    }
    let need =
        |p: Option<PathBuf>, k: &str| p.ok_or_else(|| anyhow!("tls_server_config: {k} is missing"));
    let (cert, key) = (need(cert, "cert_file")?, need(key, "key_file")?);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| anyhow!("cert_file '{}': {e}", cert.display()))?;
    if certs.is_empty() {
        bail!("cert_file '{}' holds no certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&key)
        .map_err(|e| anyhow!("key_file '{}': {e}", key.display()))?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = if min == &rustls::version::TLS13
    {
        vec![&rustls::version::TLS13]
    } else {
        vec![&rustls::version::TLS13, &rustls::version::TLS12]
    };
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&versions)
        .map_err(|e| anyhow!("tls_server_config: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| anyhow!("tls_server_config: the certificate and key do not fit: {e}"))
}

/// Checks `Authorization: Basic …` against the users' bcrypt hashes. A bcrypt check
/// costs tens of milliseconds: a pair that passed is remembered (as exporter-toolkit does),
/// at most [`Auth::CACHE`] of them.
#[derive(Debug, Default)]
pub struct Auth {
    users: BTreeMap<String, String>,
    passed: Mutex<Vec<(String, String)>>,
}

impl Auth {
    const CACHE: usize = 64;

    /// No user configured: every request is allowed.
    pub fn is_open(&self) -> bool {
        self.users.is_empty()
    }

    pub fn new(users: BTreeMap<String, String>) -> Self {
        Auth {
            users,
            passed: Mutex::new(Vec::new()),
        }
    }

    /// True when no user is configured, or the header names one with the right password.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        use base64::Engine;
        if self.users.is_empty() {
            return true;
        }
        let Some(b64) = authorization.and_then(|a| a.strip_prefix("Basic ")) else {
            return false;
        };
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
            return false;
        };
        let Ok(pair) = String::from_utf8(raw) else {
            return false;
        };
        let Some((user, pass)) = pair.split_once(':') else {
            return false;
        };
        let key = (user.to_string(), pass.to_string());
        if self.passed.lock().is_ok_and(|p| p.contains(&key)) {
            return true;
        }
        // An unknown user costs a bcrypt check too: timing does not tell users apart.
        const NOBODY: &str = "$2y$10$QPjdm0QeJYHuQ0bqh9IyVeiE7lbgqpxuVh9xJQBTqMb1zQQAKGd1W";
        let (hash, known) = match self.users.get(user) {
            Some(h) => (h.as_str(), true),
            None => (NOBODY, false),
        };
        let ok = known && bcrypt::verify(pass, hash).unwrap_or(false);
        if !known {
            let _ = bcrypt::verify(pass, hash);
        }
        if ok {
            if let Ok(mut p) = self.passed.lock() {
                if p.len() >= Self::CACHE {
                    p.remove(0);
                }
                p.push(key);
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_unknown_keys() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let cfg = parse(
            &format!("basic_auth_users:\n  alice: {hash}\n"),
            Path::new("/"),
        )
        .unwrap();
        assert!(cfg.tls.is_none());
        let auth = Auth::new(cfg.users);
        use base64::Engine;
        let b = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert!(auth.allows(Some(&b("alice:secret"))));
        assert!(auth.allows(Some(&b("alice:secret"))), "cached");
        assert!(!auth.allows(Some(&b("alice:wrong"))));
        assert!(!auth.allows(Some(&b("bob:secret"))));
        assert!(!auth.allows(None));
        assert!(Auth::default().allows(None), "no users: open");

        let e = parse("http_server_config:\n  http2: false\n", Path::new("/")).unwrap_err();
        assert!(
            format!("{e:#}").contains("'http_server_config' is not supported"),
            "{e:#}"
        );
        let e = parse("basic_auth_users:\n  alice: plain\n", Path::new("/")).unwrap_err();
        assert!(format!("{e:#}").contains("not a bcrypt hash"), "{e:#}");
        let e = parse(
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("NoClientCert only"), "{e:#}");
        assert!(parse("", Path::new("/")).unwrap().users.is_empty());
    }

    #[test]
    fn the_dummy_hash_is_a_bcrypt_hash() {
        assert!(
            bcrypt_hash("$2y$10$QPjdm0QeJYHuQ0bqh9IyVeiE7lbgqpxuVh9xJQBTqMb1zQQAKGd1W").is_ok()
        );
    }
}

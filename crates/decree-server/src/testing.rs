//! Throwaway certificate authorities and pair secrets for tests and benchmarks (the `testing` feature),
//! with the test etcd cluster ([`etcd`]) and loopback ports ([`ports`]).
//!
//! A real deployment gets its certificates from its own CA; a test must make its own, with
//! the faults it needs (another CA, an expired certificate, a name not allowed), without an
//! `openssl` binary or files checked into the repository. Keys are ECDSA P-256, made fresh
//! each time. Not for production: the keys are written unencrypted wherever the test says.

pub mod etcd;
pub mod ports;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate and its key, written as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PKCS#8 PEM).
    pub key: PathBuf,
}

/// How long an issued certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From yesterday to ten years from now.
    Current,
    /// 2020 only: long expired.
    Expired,
}

/// A certificate authority that lives as long as the test.
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl TestCa {
    /// A new CA whose certificate names `common_name`.
    pub fn new(common_name: &str) -> TestCa {
        let key = KeyPair::generate().expect("generate a CA key");
        let mut params = CertificateParams::new(Vec::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(DnType::CommonName, common_name);
        let pem = params.self_signed(&key).expect("self-sign the CA").pem();
        TestCa { params, key, pem }
    }

    /// Writes the CA certificate to `path` (what `tls.client_ca` or a client's CA names).
    pub fn write_ca(&self, path: &Path) -> PathBuf {
        std::fs::write(path, &self.pem).expect("write the CA certificate");
        path.to_path_buf()
    }

    /// A server certificate for `localhost` and 127.0.0.1 (what tests connect to), written
    /// as `<dir>/<stem>.pem` and `<dir>/<stem>.key`.
    pub fn server(&self, dir: &Path, stem: &str, validity: Validity) -> CertFiles {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        self.issue(dir, stem, names, "localhost", vec![ExtendedKeyUsagePurpose::ServerAuth], validity)
    }

    /// A pair member's certificate naming `name`, usable both ways on the link (the backup
    /// serves with it, the primary dials with it), as `<dir>/<name>.pem` and `.key`.
    pub fn member(&self, dir: &Path, name: &str) -> CertFiles {
        let usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(dir, name, vec![name.to_string()], name, usages, Validity::Current)
    }

    /// A client certificate naming `name` (as DNS subject-alternative name and common
    /// name), written as `<dir>/<name>.pem` and `<dir>/<name>.key`.
    pub fn client(&self, dir: &Path, name: &str, validity: Validity) -> CertFiles {
        self.issue(
            dir,
            name,
            vec![name.to_string()],
            name,
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            validity,
        )
    }

    fn issue(
        &self,
        dir: &Path,
        stem: &str,
        names: Vec<String>,
        common_name: &str,
        usages: Vec<ExtendedKeyUsagePurpose>,
        validity: Validity,
    ) -> CertFiles {
        let key = KeyPair::generate().expect("generate a key");
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = usages;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let (not_before, not_after) = match validity {
            Validity::Current => {
                let now = std::time::SystemTime::now();
                let day = std::time::Duration::from_secs(86_400);
                (now - day, now + 3650 * day)
            }
            Validity::Expired => (
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_577_836_800), // 2020-01-01
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_609_372_800), // 2020-12-31
            ),
        };
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign the certificate");
        let files = CertFiles { cert: dir.join(format!("{stem}.pem")), key: dir.join(format!("{stem}.key")) };
        std::fs::write(&files.cert, cert.pem()).expect("write the certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write the key");
        files
    }
}

/// The pair secret `dir/pair.secret`, written by [`write_pair_secret`] unless it exists: the
/// one file both members of a test's pair name in `[pair] secret_file`.
pub fn pair_secret(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join("pair.secret");
    if !path.exists() {
        write_pair_secret(&path)?;
    }
    Ok(path)
}

/// Writes a fresh pair secret (`[pair] secret_file`: 32 random bytes in hex) to `path`,
/// readable by its owner only, for the two members of a test's pair.
pub fn write_pair_secret(path: &Path) -> std::io::Result<()> {
    use ring::rand::SecureRandom;
    use std::os::unix::fs::PermissionsExt;
    let mut secret = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| std::io::Error::other("the system's random source failed"))?;
    let text: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

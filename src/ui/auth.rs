//! HTTP basic auth: the configured credentials are kept as SHA-256 digests of `user:password`
//! and compared in constant time (`subtle`), so neither the comparison nor its length leaks.

use super::Access;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// One configured credential.
#[derive(Clone)]
struct Credential {
    digest: [u8; 32],
    user: String,
    access: Access,
}

/// The credentials a router accepts; empty when no auth is configured.
#[derive(Clone, Default)]
pub(crate) struct Credentials {
    accepted: Vec<Credential>,
}

fn digest(user: &str, password: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(user.as_bytes());
    h.update(b":");
    h.update(password.as_bytes());
    h.finalize().into()
}

impl Credentials {
    /// Operator credentials give `cap`; read-only ones give [`Access::ReadOnly`].
    pub(crate) fn new(
        operator: Option<&(String, String)>,
        read_only: Option<&(String, String)>,
        cap: Access,
    ) -> Self {
        let mut accepted = Vec::new();
        for (cred, access) in [(operator, cap), (read_only, Access::ReadOnly)] {
            if let Some((user, password)) = cred {
                accepted.push(Credential {
                    digest: digest(user, password),
                    user: user.clone(),
                    access,
                });
            }
        }
        Self { accepted }
    }

    /// Whether any credential is configured.
    pub(crate) fn required(&self) -> bool {
        !self.accepted.is_empty()
    }

    /// The user and access an `Authorization` header value gives, if it matches one. Every
    /// configured credential is compared, so the time does not tell which one matched.
    pub(crate) fn check(&self, header: Option<&str>) -> Option<(String, Access)> {
        let (user, password) = parse_basic(header?)?;
        let given = digest(&user, &password);
        let mut found = None;
        for c in &self.accepted {
            if bool::from(c.digest.ct_eq(&given)) {
                found = Some((c.user.clone(), c.access));
            }
        }
        found
    }
}

/// `Basic base64(user:password)` → (user, password).
fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(rest.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, pass: &str) -> String {
        format!("Basic {}", STANDARD.encode(format!("{user}:{pass}")))
    }

    #[test]
    fn credentials_give_their_access_and_nothing_else_matches() {
        let op = ("admin".to_string(), "s3cret:with:colons".to_string());
        let ro = ("viewer".to_string(), "look".to_string());
        let c = Credentials::new(Some(&op), Some(&ro), Access::Operator);
        assert!(c.required());
        assert_eq!(
            c.check(Some(&header("admin", "s3cret:with:colons"))),
            Some(("admin".into(), Access::Operator))
        );
        assert_eq!(
            c.check(Some(&header("viewer", "look"))),
            Some(("viewer".into(), Access::ReadOnly))
        );
        for bad in [
            header("admin", "wrong"),
            header("viewer", "s3cret:with:colons"),
            "Bearer abc".into(),
            "Basic !!!".into(),
            String::new(),
        ] {
            assert_eq!(c.check(Some(&bad)), None, "{bad}");
        }
        assert_eq!(c.check(None), None);
        // The cap applies to operator credentials.
        let capped = Credentials::new(Some(&op), None, Access::ReadOnly);
        assert_eq!(
            capped.check(Some(&header("admin", "s3cret:with:colons"))),
            Some(("admin".into(), Access::ReadOnly))
        );
        assert!(!Credentials::default().required());
    }
}

//! Content-addressed packets (E3): a packet body is stored once under the sha256 of its
//! canonical JSON; a ref (`v1:<hex>`) names it; reading recomputes and checks the hash.

use crate::error::{Error, Result};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The ref version this build writes and reads.
pub const REF_VERSION: &str = "v1";

/// Writing a packet that is already stored bumps its `used_at` only when the stored time is
/// older than this (retention's clock for packets), so a hot packet is not rewritten on every
/// start.
pub const USED_AT_GRANULARITY: chrono::Duration = chrono::Duration::minutes(1);

/// Retention never collects a packet written less than this long ago, whatever the cutoffs: a
/// start or step writes its packets a moment before the job row that references them, and
/// must not lose them in between.
pub const MIN_UNUSED_AGE: chrono::Duration = chrono::Duration::hours(1);

/// A packet's canonical text and its ref.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedPacket {
    /// `v1:<sha256 hex>`.
    pub reference: String,
    /// The sha256 hex alone (the storage key).
    pub hash: String,
    /// Canonical JSON (object keys sorted, no insignificant whitespace).
    pub body: String,
}

/// Encodes a packet for storage.
pub fn encode(value: &Value) -> Result<EncodedPacket> {
    let body = crate::action::encode_args(value).map_err(|e| match e {
        Error::InvalidInput { message, .. } => Error::invalid("packet", message),
        other => other,
    })?;
    let hash = digest(&body);
    Ok(EncodedPacket {
        reference: format!("{REF_VERSION}:{hash}"),
        hash,
        body,
    })
}

fn digest(body: &str) -> String {
    crate::claims::hex(&Sha256::digest(body.as_bytes()))
}

/// Splits a ref into its hash, refusing unknown versions and malformed hashes.
pub fn parse_ref(reference: &str) -> Result<&str> {
    let (version, hash) = reference
        .split_once(':')
        .ok_or_else(|| Error::invalid("packet ref", format!("`{reference}` has no version")))?;
    if version != REF_VERSION {
        return Err(Error::invalid(
            "packet ref",
            format!("unknown ref version `{version}` in `{reference}`"),
        ));
    }
    if hash.len() != 64
        || !hash
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(Error::invalid(
            "packet ref",
            format!("malformed hash in `{reference}`"),
        ));
    }
    Ok(hash)
}

/// Checks a stored body against its ref and decodes it.
pub fn verify(reference: &str, body: Option<String>) -> Result<Value> {
    let hash = parse_ref(reference)?;
    let body =
        body.ok_or_else(|| Error::invalid("packet", format!("body of `{reference}` is missing")))?;
    if digest(&body) != hash {
        return Err(Error::invalid(
            "packet",
            format!("body of `{reference}` fails its integrity check"),
        ));
    }
    serde_json::from_str(&body)
        .map_err(|e| Error::invalid("packet", format!("body of `{reference}`: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn same_content_same_ref_whatever_key_order() {
        let a = encode(&json!({"a": 1, "b": [1, 2]})).unwrap();
        let b: Value = serde_json::from_str(r#"{"b":[1,2],"a":1}"#).unwrap();
        assert_eq!(a.reference, encode(&b).unwrap().reference);
        assert_eq!(
            verify(&a.reference, Some(a.body.clone())).unwrap(),
            json!({"a": 1, "b": [1, 2]})
        );
    }

    #[test]
    fn corrupt_missing_and_unknown_refs_are_errors_not_panics() {
        let a = encode(&json!({"x": 1})).unwrap();
        assert!(verify(&a.reference, Some(r#"{"x":2}"#.into()))
            .unwrap_err()
            .to_string()
            .contains("integrity"));
        assert!(verify(&a.reference, None)
            .unwrap_err()
            .to_string()
            .contains("missing"));
        assert!(
            verify(&a.reference.replace("v1", "v9"), Some(a.body.clone()))
                .unwrap_err()
                .to_string()
                .contains("unknown ref version")
        );
        assert!(parse_ref("v1:zz").is_err());
        assert!(parse_ref("nonsense").is_err());
    }
}

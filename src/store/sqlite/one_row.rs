//! SQLite: many-row reads on the pipelines' hot path answered as one row.
//!
//! sqlx's SQLite driver hands every row of a result from its connection's worker thread to the
//! caller as a message of its own, and on a busy 2-core machine a message can cost a thread
//! wake-up. A read that returns a chunk's hundred rows (its packets, its worklist rows, the
//! claims it hands over) folds them into one JSON value in SQL (`json_group_array`,
//! `json_group_object`), which [`decode`] turns back into Rust values.

use crate::error::{Error, Result};
use serde::de::DeserializeOwned;

/// `json` (one row's folded JSON value) decoded as `T`; a value that does not decode is
/// reported as a corrupt `what`.
pub(super) fn decode<T: DeserializeOwned>(json: &str, what: &'static str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| Error::Corrupt {
        what,
        id: 0,
        message: format!("folded rows do not decode: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::decode;
    use std::collections::HashMap;

    #[test]
    fn folded_rows_decode_and_a_bad_value_names_what_it_is() {
        let rows: Vec<(i32, String, String)> = decode(
            r#"[[1,"leased","[]"],[2,"pending","[{}]"]]"#,
            "worklist rows",
        )
        .unwrap();
        assert_eq!(rows[1], (2, "pending".into(), "[{}]".into()));
        let bodies: HashMap<String, String> = decode(r#"{"h":"{\"n\":1}"}"#, "packets").unwrap();
        assert_eq!(bodies["h"], r#"{"n":1}"#);
        let e = decode::<Vec<String>>("[1]", "claim tokens").unwrap_err();
        assert!(e.to_string().contains("claim tokens"), "{e}");
    }
}

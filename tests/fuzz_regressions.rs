//! Replays every input committed under `fuzz/regressions/<target>/` (crash inputs the
//! cargo-fuzz targets found, kept once fixed; see fuzz/run.sh) through the same checks the
//! fuzz targets run, so a fixed crash stays fixed under plain `cargo test`.

#[path = "../fuzz/checks.rs"]
mod checks;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let data = std::fs::read(entry.path()).expect("read a regression input");
        check(&data);
        n += 1;
    }
    n
}

#[test]
fn committed_fuzz_inputs_stay_fixed() {
    let total = replay("cron", checks::cron)
        + replay("args", checks::args)
        + replay("packet", checks::packet)
        + replay("url", checks::url);
    assert!(
        total > 0,
        "fuzz/regressions holds the seed inputs of every target"
    );
}

//! TLS to PostgreSQL (issue 17 item 1), against a throwaway cluster this test starts with
//! `ssl = on` and a certificate signed by a CA made at run time (openssl): `sslmode=verify-full`
//! with that CA as `sslrootcert` connects (the session is encrypted: `pg_stat_ssl`), the store
//! works over it, and a different CA is refused at once with an error that says TLS failed.
//!
//! Runs where the PostgreSQL suite runs (`DOCKHAND_TEST_POSTGRES_URL` set), using the local
//! PostgreSQL binaries (`initdb`, `pg_ctl`) and `openssl`; without the variable it is skipped
//! with one line, and with it a missing binary fails the test (CI never skips it silently).

use std::path::{Path, PathBuf};
use std::process::Command;

fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs `program args` (as the `postgres` user when this process is root: the server refuses
/// to run as root), panicking with its output when it fails.
fn sh(as_postgres: bool, program: &Path, args: &[&str]) {
    let mut cmd = if as_postgres && is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd.args(args).output().expect("run a setup command");
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (needed to make the test CA)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`NAME.crt`/`NAME.key`) in `dir`.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-subj",
            &format!("/CN=dockhand test {name}"),
        ],
    );
}

/// The stopped-on-drop cluster.
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data.to_string_lossy().into_owned();
        let _ = std::panic::catch_unwind(|| {
            sh(
                true,
                &self.bin.join("pg_ctl"),
                &["-D", &data, "stop", "-m", "immediate", "-w"],
            )
        });
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Starts a cluster on 127.0.0.1:`port` with TLS on, its certificate (for `localhost` and
/// `127.0.0.1`) signed by the CA `ca` in `dir`.
fn start_tls_cluster(bin: &Path, dir: &Path, port: u16) -> Cluster {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.crt",
            "-extfile",
            "server.ext",
        ],
    );
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    if is_root() {
        sh(
            false,
            Path::new("chown"),
            &["-R", "postgres:", &dir.to_string_lossy()],
        );
        sh(false, Path::new("chmod"), &["755", &dir.to_string_lossy()]);
    }
    let d = data.to_string_lossy().into_owned();
    sh(
        true,
        &bin.join("initdb"),
        &["-D", &d, "-U", "postgres", "--auth=trust", "--no-sync"],
    );
    // The key must be private to the server's user.
    for f in ["server.crt", "server.key"] {
        std::fs::copy(dir.join(f), data.join(f)).unwrap();
    }
    if is_root() {
        sh(
            false,
            Path::new("chown"),
            &[
                "postgres:",
                &format!("{d}/server.crt"),
                &format!("{d}/server.key"),
            ],
        );
    }
    sh(
        false,
        Path::new("chmod"),
        &["600", &format!("{d}/server.key")],
    );
    let cluster = Cluster {
        bin: bin.to_path_buf(),
        data: data.clone(),
    };
    let opts = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {} -c ssl=on -c fsync=off",
        dir.display()
    );
    sh(
        true,
        &bin.join("pg_ctl"),
        &[
            "-D",
            &d,
            "-o",
            &opts,
            "-l",
            &format!("{d}/server.log"),
            "-w",
            "start",
        ],
    );
    cluster
}

#[tokio::test]
async fn postgres_verify_full_connects_and_a_wrong_ca_is_refused() {
    if std::env::var("DOCKHAND_TEST_POSTGRES_URL").is_err() {
        eprintln!("skipped: DOCKHAND_TEST_POSTGRES_URL is not set (the PostgreSQL TLS test runs with the PostgreSQL suite)");
        return;
    }
    let bin = postgres_bin().expect("PostgreSQL server binaries under /usr/lib/postgresql/*/bin");
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "ca");
    make_ca(dir.path(), "wrong");
    let port = free_port();
    let _cluster = start_tls_cluster(&bin, dir.path(), port);
    let url = |ca: &str| {
        format!(
            "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            dir.path().join(ca).display()
        )
    };

    // The right CA: connected, encrypted, and the store works over it.
    let store = dockhand::connect(&url("ca.crt"))
        .await
        .expect("verify-full with the right CA");
    store.migrate().await.expect("migrate over TLS");
    let queue = dockhand::Queue::new(store.clone());
    let id = queue
        .enqueue(dockhand::ActionSpec::new(
            "tls.check",
            serde_json::json!({}),
        ))
        .await
        .expect("enqueue over TLS");
    assert_eq!(queue.get(id).await.unwrap().hook, "tls.check");
    let pool = sqlx::PgPool::connect(&url("ca.crt")).await.unwrap();
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(encrypted, "the session is TLS");
    pool.close().await;
    store.close().await;

    // Another CA: refused at once, saying TLS failed and where.
    let err = match dockhand::connect(&url("wrong.crt")).await {
        Ok(_) => panic!("a certificate from another CA must be refused"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(
        matches!(err, dockhand::Error::Connect { .. }),
        "a connect error: {err:?}"
    );
    assert!(
        msg.contains("TLS") && msg.contains(&format!("127.0.0.1:{port}")),
        "{msg}"
    );
    assert!(
        msg.to_lowercase().contains("certificate"),
        "names the certificate: {msg}"
    );
}

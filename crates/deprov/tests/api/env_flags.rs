//! Environment flags of `deprov serve` (the binary).

/// Boolean environment flags take the usual boolish values, as `DEPROV_MIGRATE=0` always did:
/// `DEPROV_NO_WORKER=1` was refused by clap (`[possible values: true, false]`).
#[test]
fn boolean_env_flags_accept_1_0_yes_no_on_off() {
    let run = |name: &str, value: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
            .arg("serve")
            .env("DEPROV_DATABASE_URL", "postgres://127.0.0.1:1/x")
            .env("DEPROV_CONFIG", "/nonexistent/deprov.toml")
            .env(name, value)
            .output()
            .unwrap()
    };
    for name in ["DEPROV_NO_WORKER", "DEPROV_MIGRATE"] {
        for value in ["1", "0", "yes", "no", "on", "off", "true", "false"] {
            let out = run(name, value);
            let stderr = String::from_utf8_lossy(&out.stderr);
            // Past argument parsing: it fails on the missing config file (1), not clap's usage (2).
            assert_eq!(out.status.code(), Some(1), "{name}={value}: {stderr}");
            assert!(
                stderr.contains("/nonexistent/deprov.toml"),
                "{name}={value}: {stderr}"
            );
        }
        let out = run(name, "maybe");
        assert_eq!(out.status.code(), Some(2), "{name}=maybe");
    }
}

//! The native guard (native/, the `pgfence_native` extension) built for the test run: no `make install`, no
//! root. When the server's development files are there (`pg_config`, the server headers, PGXS, `make` and a C
//! compiler), native/ is built once per source (a directory of the target's tmp directory named by a hash of
//! native/'s files and the server's version) next to a private copy of the server's installation — its binaries
//! linked or copied, its `share` and `lib` directories mirrored by symbolic links, with the extension's control
//! file, script and library added. PostgreSQL finds its `share` and `lib` directories relative to its own binary,
//! so a server started from that copy can `CREATE EXTENSION pgfence_native`; the system's installation is not
//! touched. Concurrent test processes each build into a directory of their own and rename it into place: the
//! first rename wins, the others' builds are discarded.
//!
//! Without the development files the tests that need the extension skip, saying so on one line that names what to
//! install — unless `PGFENCE_REQUIRE_NATIVE` is set (CI), when they fail. An extension installed on the system
//! (`make -C native install`) is used when the build is not possible.
//!
//! Self-contained (std and `pgfence::embedded` only): also included by the CLI's tests (`#[path]`).
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A PostgreSQL installation whose server can create the `pgfence_native` extension.
#[derive(Debug)]
pub struct NativeInstall {
    /// Its binaries (`initdb`, `pg_ctl`, `postgres`): a server started from them has the extension.
    pub bin_dir: PathBuf,
    /// Where it came from: "built from native/ into <dir>" or "installed on the system".
    pub origin: String,
}

/// The installation with the native guard, or why there is none (what to install). Built at most once per
/// process, and once per source for all processes sharing the target directory.
pub fn install() -> Result<&'static NativeInstall, &'static str> {
    static INSTALL: OnceLock<Result<NativeInstall, String>> = OnceLock::new();
    INSTALL
        .get_or_init(find_or_build)
        .as_ref()
        .map_err(String::as_str)
}

/// Whether native guard tests must run (CI sets `PGFENCE_REQUIRE_NATIVE=1`): then a missing build fails them.
pub fn required() -> bool {
    std::env::var_os("PGFENCE_REQUIRE_NATIVE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The installation for a test that needs the native guard, or `None` after one loud line on stderr (not captured
/// by the test harness, once per process) saying that native guard tests are skipped and what to install. Panics instead when
/// [`required`].
pub fn for_test(test: &str) -> Option<&'static NativeInstall> {
    match install() {
        Ok(install) => Some(install),
        Err(why) if required() => panic!("PGFENCE_REQUIRE_NATIVE is set, but {why}"),
        Err(why) => {
            // One line per test process, whichever of its tests asks first.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED the native guard's tests ({test} and the others of this binary): pgfence_native \
                     cannot be built: {why} (PGFENCE_REQUIRE_NATIVE=1 makes this a failure)"
                );
            });
            None
        }
    }
}

/// The repository's native/ directory.
fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("native"))
        .find(|dir| dir.join("pgfence_native.control").is_file())
        .expect("native/pgfence_native.control above the package")
}

/// The files of native/ that make the extension.
const SOURCES: [&str; 4] = [
    "Makefile",
    "pgfence_native.c",
    "pgfence_native.control",
    "pgfence_native--0.1.sql",
];

fn find_or_build() -> Result<NativeInstall, String> {
    let bin = pgfence::embedded::find_bin_dir().map_err(|e| e.to_string())?;
    let chosen = std::env::var_os("PG_CONFIG").filter(|v| !v.is_empty());
    let pg_config = match pg_config_of(&bin, chosen.as_deref()) {
        Ok(pg_config) => pg_config,
        Err(why) => return installed(&bin, &why),
    };
    let config = |flag: &str| -> Option<PathBuf> {
        let out = Command::new(&pg_config).arg(flag).output().ok()?;
        out.status
            .success()
            .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    let (Some(version), Some(bindir), Some(sharedir), Some(pkglibdir), Some(headers), Some(pgxs)) = (
        config("--version"),
        config("--bindir"),
        config("--sharedir"),
        config("--pkglibdir"),
        config("--includedir-server"),
        config("--pgxs"),
    ) else {
        return installed(&bin, "pg_config answered no paths");
    };
    let major = version
        .to_string_lossy()
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').next())
        .unwrap_or("NN")
        .to_owned();
    let hint = format!("install Debian's postgresql-server-dev-{major}, make and gcc");
    if !headers.join("postgres.h").is_file() || !pgxs.is_file() {
        return installed(
            &bin,
            &format!(
                "the server's headers ({}) or PGXS are missing; {hint}",
                headers.display()
            ),
        );
    }
    // The C compiler PGXS runs is the one the server was built with (`pg_config --cc`).
    let cc = config("--cc").map(|cc| {
        cc.to_string_lossy()
            .split_whitespace()
            .next()
            .unwrap_or("cc")
            .to_owned()
    });
    for tool in ["make", cc.as_deref().unwrap_or("cc")] {
        if Command::new(tool).arg("--version").output().is_err() {
            return installed(&bin, &format!("`{tool}` not found; {hint}"));
        }
    }

    let source = source_dir();
    let mut hash = Fnv::default();
    hash.add(version.to_string_lossy().as_bytes());
    hash.add(bindir.to_string_lossy().as_bytes());
    // The layout of the copy: a change here must not reuse copies made the old way.
    hash.add(b"layout 2: bin, share, lib, locale");
    for name in SOURCES {
        hash.add(name.as_bytes());
        hash.add(&std::fs::read(source.join(name)).map_err(|e| format!("{name}: {e}"))?);
    }
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pgfence-native");
    let done = base.join(format!("{:016x}", hash.0));
    let (bin_rel, _) = mirror_paths(&bindir, &sharedir, &pkglibdir)?;
    if !done.join("ready").is_file() {
        let scratch = base.join(format!(
            "build-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let built = build(
            &source, &scratch, &pg_config, &bindir, &sharedir, &pkglibdir,
        );
        if let Err(e) = built {
            let _ = std::fs::remove_dir_all(&scratch);
            // The development files are there, so a build that fails is a real failure (of native/ or of this).
            panic!("building the native guard in {}: {e}", scratch.display());
        }
        // The first process to finish wins; a later one finds the directory taken and drops its own build.
        if std::fs::rename(&scratch, &done).is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        assert!(
            done.join("ready").is_file(),
            "no native guard build in {}",
            done.display()
        );
    }
    Ok(NativeInstall {
        bin_dir: done.join("root").join(bin_rel),
        origin: format!("built from native/ into {}", done.display()),
    })
}

/// The `pg_config` of the installation whose server binaries are `bin` (the ones `PG_BIN` names, or else the
/// ones found on `PATH` or under /usr/lib/postgresql): `chosen` (`PG_CONFIG`, as for PGXS), else `bin/pg_config`, else the one
/// on `PATH` — and only if its `--bindir` is `bin`. A `pg_config` of another installation (Debian's 15 on `PATH`
/// while `PG_BIN` names a packaged 18) would build the extension for that one, and the tests would start its
/// server instead of `bin`'s: that is refused, saying why.
pub fn pg_config_of(bin: &Path, chosen: Option<&std::ffi::OsStr>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match chosen {
        Some(chosen) => vec![chosen.into()],
        None => vec![bin.join("pg_config"), "pg_config".into()],
    };
    let same = |dir: &Path| {
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        real(dir) == real(bin)
    };
    let mut others = Vec::new();
    for candidate in candidates {
        let Some(bindir) = pg_config_path(&candidate, "--bindir") else {
            continue;
        };
        if same(&bindir) {
            return Ok(candidate);
        }
        others.push(format!(
            "{} is the one of {}",
            candidate.display(),
            bindir.display()
        ));
    }
    let found = if others.is_empty() {
        "none found".to_owned()
    } else {
        others.join("; ")
    };
    Err(format!(
        "no pg_config of the server in {} ({found}): the native guard is built only against the server the \
         tests run (PG_BIN); install that server's development files (Debian's postgresql-server-dev-NN, make \
         and gcc) or set PG_CONFIG to its pg_config",
        bin.display()
    ))
}

/// The system's installation when it has the extension (`make -C native install`), or else `why`.
fn installed(bin: &Path, why: &str) -> Result<NativeInstall, String> {
    let has = Command::new(bin.join("pg_config"))
        .arg("--sharedir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            Path::new(String::from_utf8_lossy(&o.stdout).trim())
                .join("extension/pgfence_native.control")
                .is_file()
        });
    if has {
        Ok(NativeInstall {
            bin_dir: bin.to_path_buf(),
            origin: "installed on the system (make -C native install)".into(),
        })
    } else {
        Err(why.to_owned())
    }
}

/// The bin, share and lib directories relative to their longest common parent: where they go in the copy, so that
/// the copied server finds the copied share and lib where it would look for them (PostgreSQL's
/// `make_relative_path`).
fn mirror_paths(
    bindir: &Path,
    sharedir: &Path,
    pkglibdir: &Path,
) -> Result<(PathBuf, [PathBuf; 2]), String> {
    let mut common = bindir.to_path_buf();
    while !(sharedir.starts_with(&common) && pkglibdir.starts_with(&common)) {
        if !common.pop() {
            return Err("the server's directories share no parent".into());
        }
    }
    let rel = |p: &Path| {
        p.strip_prefix(&common)
            .map(Path::to_path_buf)
            .map_err(|e| e.to_string())
    };
    Ok((rel(bindir)?, [rel(sharedir)?, rel(pkglibdir)?]))
}

/// `pg_config <flag>`'s path.
fn pg_config_path(pg_config: &Path, flag: &str) -> Option<PathBuf> {
    let out = Command::new(pg_config).arg(flag).output().ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Where `dir` goes in the copy (see [`mirror_paths`]), if it lies under the same parent as the others.
fn mirror_rel(
    bindir: &Path,
    sharedir: &Path,
    pkglibdir: &Path,
    dir: &Path,
) -> Result<PathBuf, String> {
    let (bin_rel, _) = mirror_paths(bindir, sharedir, pkglibdir)?;
    let common = bin_rel.components().fold(bindir.to_path_buf(), |mut p, _| {
        p.pop();
        p
    });
    dir.strip_prefix(&common)
        .map(Path::to_path_buf)
        .map_err(|e| e.to_string())
}

fn build(
    source: &Path,
    scratch: &Path,
    pg_config: &Path,
    bindir: &Path,
    sharedir: &Path,
    pkglibdir: &Path,
) -> Result<(), String> {
    let io = |what: &str, p: &Path| {
        let (what, p) = (what.to_owned(), p.display().to_string());
        move |e: std::io::Error| format!("{what} {p}: {e}")
    };
    let src = scratch.join("src");
    std::fs::create_dir_all(&src).map_err(io("creating", &src))?;
    for name in SOURCES {
        std::fs::copy(source.join(name), src.join(name))
            .map_err(io("copying", &source.join(name)))?;
    }
    let make = Command::new("make")
        .current_dir(&src)
        .arg("-s")
        .arg(format!("PG_CONFIG={}", pg_config.display()))
        .arg("with_llvm=no")
        .output()
        .map_err(|e| format!("running make: {e}"))?;
    if !make.status.success() {
        return Err(format!(
            "make failed:\n{}{}",
            String::from_utf8_lossy(&make.stdout),
            String::from_utf8_lossy(&make.stderr)
        ));
    }

    let root = scratch.join("root");
    let (bin_rel, [share_rel, lib_rel]) = mirror_paths(bindir, sharedir, pkglibdir)?;
    // The binaries themselves (hard links, or copies where linking is not allowed): PostgreSQL resolves symbolic
    // links to its binary before it looks for its share and lib directories.
    let bin = root.join(&bin_rel);
    std::fs::create_dir_all(&bin).map_err(io("creating", &bin))?;
    for entry in std::fs::read_dir(bindir).map_err(io("reading", bindir))? {
        let entry = entry.map_err(io("reading", bindir))?;
        let from = std::fs::canonicalize(entry.path()).map_err(io("resolving", &entry.path()))?;
        if !from.is_file() {
            continue;
        }
        let to = bin.join(entry.file_name());
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(io("copying", &from))?;
        }
    }
    // share and lib: every entry a symbolic link to the system's, the extension's own files added.
    let share = root.join(&share_rel);
    mirror(sharedir, &share, &["extension"])?;
    mirror(
        &sharedir.join("extension"),
        &share.join("extension"),
        &["pgfence_native"],
    )?;
    for name in ["pgfence_native.control", "pgfence_native--0.1.sql"] {
        std::fs::copy(src.join(name), share.join("extension").join(name))
            .map_err(io("copying", &src.join(name)))?;
    }
    // The message translations (lc_messages): PostgreSQL looks for them relative to its binary too.
    if let Some(localedir) = pg_config_path(pg_config, "--localedir") {
        if let Ok(rel) = mirror_rel(bindir, sharedir, pkglibdir, &localedir) {
            let to = root.join(rel);
            if !to.exists() && localedir.is_dir() {
                std::os::unix::fs::symlink(&localedir, &to)
                    .map_err(|e| format!("linking {}: {e}", localedir.display()))?;
            }
        }
    }
    let lib = root.join(&lib_rel);
    mirror(pkglibdir, &lib, &["pgfence_native"])?;
    std::fs::copy(src.join("pgfence_native.so"), lib.join("pgfence_native.so"))
        .map_err(io("copying", &src.join("pgfence_native.so")))?;
    std::fs::write(scratch.join("ready"), b"").map_err(io("writing", &scratch.join("ready")))?;
    Ok(())
}

/// Creates `to` with a symbolic link to each entry of `from`, except those whose name starts with one of `except`.
fn mirror(from: &Path, to: &Path, except: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))? {
        let entry = entry.map_err(|e| format!("reading {}: {e}", from.display()))?;
        let name = entry.file_name();
        if except.iter().any(|x| name.to_string_lossy().starts_with(x)) {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), to.join(&name))
            .map_err(|e| format!("linking {}: {e}", entry.path().display()))?;
    }
    Ok(())
}

/// FNV-1a, 64 bits: a hash that stays the same across toolchains (std's does not promise to).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for b in bytes.iter().chain(&[0xff]) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

//! Finds libte for the linker. In order:
//!
//! 1. `LIBTE_LIB_DIR`: the directory holding `libte.so` (e.g. `build/release` of a source build);
//! 2. the `pkg-config` command (or `$PKG_CONFIG`): `pkg-config --libs-only-L --libs-only-l te`,
//!    which honours `PKG_CONFIG_PATH` (an installed prefix's `lib/pkgconfig`, where
//!    `cmake --install` puts `te.pc`);
//! 3. the bundled build: the libte repository this crate sits in (`bindings/rust/libte-sys`, so
//!    the root is three directories up) is configured with CMake into `OUT_DIR` (tests,
//!    benchmarks and examples off; the CUDA backend per `LIBTE_SYS_CUDA`: `AUTO` (default, as
//!    CMake does: built when the toolkit is found), `ON` or `OFF`) and its `te` target is built.
//!    `CMAKE` names the cmake program (default `cmake`); Ninja is used when it is on `PATH`.
//!
//! None working is a build error that says how to fix each. Whichever way libte is found, its
//! directory is exported to dependents' build scripts as `DEP_TE_LIB_DIR` (`links` metadata;
//! not for a system directory pkg-config gives no `-L` for) and this crate's own tests get an
//! rpath to it (`-Wl,-rpath`). Cargo applies a build script's link arguments only to the
//! package's own binaries, tests and examples, never to a dependent's: a program that depends
//! on this crate (or on `libte`) adds the rpath itself with a one-line build script (README).
//!
//! No third-party crates: pkg-config and cmake are run with `std::process::Command`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{self, Command};

fn main() {
    for var in [
        "LIBTE_LIB_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
        "LIBTE_SYS_CUDA",
        "CMAKE",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");

    // docs.rs and similar builders have no libte; the crate's API does not depend on it.
    if env::var_os("DOCS_RS").is_some() {
        return;
    }

    if let Some(dir) = env::var_os("LIBTE_LIB_DIR") {
        let dir = Path::new(&dir);
        if !dir.is_dir() {
            fail(&format!(
                "LIBTE_LIB_DIR={} is not a directory; set it to the directory that holds libte.so",
                dir.display()
            ));
        }
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        link_dir(&dir);
        println!("cargo:rustc-link-lib=dylib=te");
        return;
    }

    let pkg_config_error = match pkg_config() {
        Ok(()) => return,
        Err(why) => why,
    };
    if let Err(why) = bundled() {
        fail(&format!(
            "could not find libte.\n\
             \n  pkg-config: {}\
             \n  bundled build: {}\n\
             \nEither install libte and point pkg-config at its te.pc:\n\
             \n    cmake --install build/release --prefix \"$PREFIX\"\
             \n    export PKG_CONFIG_PATH=\"$PREFIX/lib/pkgconfig\"\n\
             \nor name the directory holding libte.so:\n\
             \n    export LIBTE_LIB_DIR=/path/to/libte/build/release\n\
             \nor let this crate build libte from the repository it sits in (needs cmake, a C++17 \
             compiler and OpenBLAS: scripts/install_deps.sh; LIBTE_SYS_CUDA=OFF skips CUDA).",
            pkg_config_error, why
        ));
    }
}

/// Link search path, `DEP_TE_LIB_DIR` for dependents, and an rpath for this crate's own tests.
fn link_dir(dir: &Path) {
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:lib_dir={}", dir.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
}

fn pkg_config() -> Result<(), String> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let output = Command::new(&program)
        .args(["--libs-only-L", "--libs-only-l", "te"])
        .output()
        .map_err(|e| format!("could not run `{}`: {}", program, e))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "`{} --libs-only-L --libs-only-l te` failed ({}): {}",
            program,
            output.status,
            stderr.trim().replace('\n', " ")
        ));
    }
    let stdout = String::from_utf8(output.stdout)
        .map_err(|_| format!("`{}` printed something that is not UTF-8", program))?;

    let mut dirs = Vec::new();
    let mut libs = Vec::new();
    for flag in stdout.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            dirs.push(dir.to_string());
        } else if let Some(lib) = flag.strip_prefix("-l") {
            libs.push(lib.to_string());
        }
    }
    if !libs.iter().any(|l| l == "te") {
        return Err(format!("`{}` gave no -lte: {:?}", program, stdout.trim()));
    }
    for dir in &dirs {
        link_dir(Path::new(dir));
    }
    for lib in &libs {
        println!("cargo:rustc-link-lib={}", lib);
    }

    // Best effort: where te/te.h lives, for dependents that compile C against it (DEP_TE_INCLUDE).
    if let Ok(out) = Command::new(&program)
        .args(["--variable=includedir", "te"])
        .output()
    {
        if out.status.success() {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !dir.is_empty() {
                println!("cargo:include={}", dir);
            }
        }
    }
    Ok(())
}

/// Builds libte's `te` target from the repository around this crate into `OUT_DIR`.
fn bundled() -> Result<(), String> {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?);
    let root = manifest.join("../../..");
    let root = root.canonicalize().unwrap_or(root);
    for needed in ["CMakeLists.txt", "capi/include/te/te.h"] {
        if !root.join(needed).is_file() {
            return Err(format!(
                "{} has no {}: this crate is not inside a libte source tree",
                root.display(),
                needed
            ));
        }
    }
    let cuda = env::var("LIBTE_SYS_CUDA").unwrap_or_else(|_| "AUTO".to_string());
    let cuda = match cuda.trim().to_ascii_uppercase().as_str() {
        "" | "AUTO" => "AUTO",
        "ON" | "1" | "YES" | "TRUE" => "ON",
        "OFF" | "0" | "NO" | "FALSE" => "OFF",
        other => return Err(format!("LIBTE_SYS_CUDA={} is not AUTO, ON or OFF", other)),
    };
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let build = out.join("libte-build");
    let cmake = env::var("CMAKE").unwrap_or_else(|_| "cmake".to_string());

    let mut configure = Command::new(&cmake);
    configure
        .arg("-S")
        .arg(&root)
        .arg("-B")
        .arg(&build)
        .args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DTE_BUILD_TESTS=OFF",
            "-DTE_BUILD_BENCH=OFF",
            "-DTE_BUILD_EXAMPLES=OFF",
            "-DTE_BUILD_FUZZERS=OFF",
        ])
        .arg(format!("-DTE_WITH_CUDA={}", cuda));
    // A build directory keeps the generator it was first configured with.
    if !build.join("CMakeCache.txt").exists()
        && env::var_os("CMAKE_GENERATOR").is_none()
        && Command::new("ninja").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
    {
        configure.args(["-G", "Ninja"]);
    }
    run(&mut configure, &cmake)?;

    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".to_string());
    let mut compile = Command::new(&cmake);
    compile
        .arg("--build")
        .arg(&build)
        .args(["--target", "te", "--parallel", &jobs]);
    run(&mut compile, &cmake)?;
    if !build.join("libte.so").exists() {
        return Err(format!("the build left no libte.so in {}", build.display()));
    }

    link_dir(&build);
    println!("cargo:rustc-link-lib=dylib=te");
    println!("cargo:include={}", root.join("capi/include").display());
    // Rebuild when the C sources change (cargo scans directories recursively).
    for path in ["CMakeLists.txt", "cmake", "capi", "core"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    Ok(())
}

/// Runs a command; its output goes to this script's stderr (cargo shows it with -vv or on
/// failure), never to stdout, where cargo reads `cargo:` instructions.
fn run(cmd: &mut Command, program: &str) -> Result<(), String> {
    let output = cmd
        .output()
        .map_err(|e| format!("could not run `{}`: {}", program, e))?;
    eprint!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    if output.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&output.stderr).to_string() + &String::from_utf8_lossy(&output.stdout);
    let tail: Vec<&str> = text.lines().rev().take(15).collect();
    Err(format!(
        "`{:?}` failed ({}); the last lines:\n    {}",
        cmd,
        output.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n    ")
    ))
}

fn fail(message: &str) -> ! {
    eprintln!("error: libte-sys: {}", message);
    process::exit(1);
}

//! Finds libte for the linker. In order:
//!
//! 1. `LIBTE_LIB_DIR`: the directory holding `libte.so` (e.g. `build/release` of a source build);
//! 2. the `pkg-config` command (or `$PKG_CONFIG`): `pkg-config --libs-only-L --libs-only-l te`,
//!    which honours `PKG_CONFIG_PATH` (an installed prefix's `lib/pkgconfig`, where
//!    `cmake --install` puts `te.pc`).
//!
//! Neither working is a build error that says how to fix it. No third-party crates: the
//! pkg-config *command* is run with `std::process::Command`.

use std::env;
use std::path::Path;
use std::process::{self, Command};

fn main() {
    for var in [
        "LIBTE_LIB_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
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
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=dylib=te");
        // Exposed to dependents' build scripts as DEP_TE_LIB_DIR (the `links` metadata).
        println!("cargo:lib_dir={}", dir.display());
        return;
    }

    match pkg_config() {
        Ok(()) => {}
        Err(why) => fail(&format!(
            "could not find libte.\n\
             \n  pkg-config: {}\n\
             \nEither install libte and point pkg-config at its te.pc:\n\
             \n    cmake --install build/release --prefix \"$PREFIX\"\
             \n    export PKG_CONFIG_PATH=\"$PREFIX/lib/pkgconfig\"\n\
             \nor name the directory holding libte.so:\n\
             \n    export LIBTE_LIB_DIR=/path/to/libte/build/release\n\
             \nAt run time the loader must find libte.so too (LD_LIBRARY_PATH, or a system \
             prefix).",
            why
        )),
    }
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
            stderr.trim()
        ));
    }
    let stdout = String::from_utf8(output.stdout)
        .map_err(|_| format!("`{}` printed something that is not UTF-8", program))?;

    let mut found_te = false;
    for flag in stdout.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={}", dir);
            println!("cargo:lib_dir={}", dir);
        } else if let Some(lib) = flag.strip_prefix("-l") {
            found_te |= lib == "te";
            println!("cargo:rustc-link-lib={}", lib);
        }
    }
    if !found_te {
        return Err(format!("`{}` gave no -lte: {:?}", program, stdout.trim()));
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

fn fail(message: &str) -> ! {
    eprintln!("error: libte-sys: {}", message);
    process::exit(1);
}

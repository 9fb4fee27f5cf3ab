//! libte-sys finds libte.so (LIBTE_LIB_DIR, pkg-config, or its bundled CMake build) and tells its
//! direct dependents where through `links` metadata (`DEP_TE_LIB_DIR`). This script:
//!
//! - gives this crate's own tests and examples an rpath to that directory, so that they run
//!   without LD_LIBRARY_PATH (cargo applies `rustc-link-arg` only to the package that prints it);
//! - passes the directory on to crates that depend on `libte` (`links = "libte"`): their build
//!   scripts read `DEP_LIBTE_LIB_DIR`. A program gets the same rpath with a one-line build.rs
//!   (bindings/rust/README.md):
//!
//!   fn main() { if let Ok(d) = std::env::var("DEP_LIBTE_LIB_DIR") { println!("cargo:rustc-link-arg=-Wl,-rpath,{}", d); } }

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_TE_LIB_DIR");
    if let Ok(dir) = env::var("DEP_TE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        println!("cargo:lib_dir={}", dir);
    }
    if let Ok(dir) = env::var("DEP_TE_INCLUDE") {
        println!("cargo:include={}", dir);
    }
}

//! The Phos guest library: what an unmodified CUDA application loads instead of NVIDIA's
//! runtime and driver. One file carries every API and is installed under each soname
//! applications ask for: `libcudart.so.11.0`, `libcudart.so.12`, `libcudart.so.13` (the
//! runtime API) and `libcuda.so.1` (the driver API). The dynamic loader loads a file once
//! however many names it is reached by, so a process that uses both APIs has one copy of the
//! guest core, hence one session (docs/architecture.md, "One library, every API").
//!
//! The **guest core** is what every API shares: the process's channels and session
//! ([`runtime`]), the fat binary [`registry`], the pinned arena ([`hostmem`]), the host
//! function thread ([`callbacks`]), [`log`]ging, and which CUDA ABI the application loaded
//! ([`soname`], [`abi`]). Each API is a module of its own ([`cudart`], [`cuda`]): the exports
//! generated from its spec (`stubs`), the pieces written by hand (`hand`), and `rt`, how its
//! calls go through the core and how its status is returned.

pub mod abi;
pub mod bypass;
mod callbacks;
mod copier;
pub mod cublas;
pub mod cublaslt;
pub mod cuda;
pub mod cudart;
pub mod cudnn;
pub mod cufft;
pub mod curand;
pub mod cusolver;
pub mod cusparse;
pub mod hostmem;
mod live;
pub mod log;
pub mod nvml;
mod pid;
pub mod profile;
pub mod registry;
pub mod runtime;
pub mod soname;

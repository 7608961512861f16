//! What the emu backend does not run is refused cleanly: a launch of a kernel with an
//! instruction the PTX interpreter does not support fails with `cudaErrorNotSupported`, the
//! API server's log names the instruction, the kernel and the PTX line, and the session goes
//! on (the error is not sticky).

use phos_protocol::CudaError;
use phos_protocol::cudart::*;
use phos_tests::{RawGuest, TestRouter};
use sha2::{Digest, Sha256};

const PTX: &str = r#".version 7.0
.target sm_80
.address_size 64

.visible .entry uses_mbarrier(.param .u64 out)
{
	.reg .b32 %r<2>;
	.shared .align 8 .b64 bar;
	mov.u32 %r1, 32;
	mbarrier.init.shared.b64 [bar], %r1;
	ret;
}

.visible .entry plain(.param .u64 out)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [out];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r1, 1234;
	st.global.u32 [%rd2], %r1;
	ret;
}
"#;

#[test]
fn unsupported_instruction_fails_the_launch_and_names_itself() {
    let router = TestRouter::start("emu");
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    let mut image = PTX.as_bytes().to_vec();
    image.push(0);
    let digest = Sha256::digest(&image);
    let module =
        g.call(&PhosModuleLoadRequest { image: &image, size: image.len() as u64, digest: &digest }).unwrap().module;
    let bad = g.call(&PhosModuleGetFunctionRequest { module, name: "uses_mbarrier" }).unwrap().function;
    let good = g.call(&PhosModuleGetFunctionRequest { module, name: "plain" }).unwrap().function;
    let out = g.call(&CudaMallocRequest { size: 4 }).unwrap().devPtr;
    let params = out.to_le_bytes();
    let one = phos_protocol::types::Dim3::new(1, 1, 1);
    let launch = |function| PhosLaunchKernelRequest {
        function,
        grid: one,
        block: one,
        sharedMem: 0,
        stream: 0,
        params: &params,
        paramSize: 8,
    };
    assert_eq!(g.call(&launch(bad)).unwrap_err(), CudaError::NotSupported.0);
    let log = router.server_logs();
    assert!(log.contains("mbarrier.init.shared.b64"), "the instruction is named: {log}");
    assert!(log.contains("uses_mbarrier"), "the kernel is named: {log}");
    assert!(log.contains("line 10"), "the PTX line is named: {log}");
    // Not sticky: the other kernel runs and the session answers.
    g.call(&launch(good)).unwrap();
    g.call(&CudaDeviceSynchronizeRequest {}).unwrap();
    let back = g
        .call(&CudaMemcpyRequest {
            dst: phos_protocol::Ptr::Out(4),
            src: phos_protocol::Ptr::Device(out),
            count: 4,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        })
        .unwrap();
    assert_eq!(back.dst.unwrap(), 1234u32.to_le_bytes());
}

#[test]
fn a_module_with_only_machine_code_has_no_image_for_emu() {
    let router = TestRouter::start("emu");
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    // An ELF header: a cubin, which the emulator cannot run.
    let mut image = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
    image.resize(256, 0);
    let digest = Sha256::digest(&image);
    let r = g.call(&PhosModuleLoadRequest { image: &image, size: image.len() as u64, digest: &digest });
    assert_eq!(r.unwrap_err(), CudaError::NoKernelImageForDevice.0);
}

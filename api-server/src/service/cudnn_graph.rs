//! `emu`'s execution of cuDNN backend plans on the CPU ([`crate::cpu_dnn`]): a plan whose
//! operation graph is one convolution forward (of float, half or bfloat16 tensors), the graph
//! reached through the plan's engine config, which names an engine (made by the program) or was
//! filled from heuristics (emu's one engine). Any other graph needs cuDNN:
//! `CUDNN_STATUS_NOT_SUPPORTED`, logged once by name.
//!
//! The walk reads the descriptors the program may have destroyed since (the plan keeps them:
//! they live on, hidden), with their attributes as the program set them; every shape and
//! pointer is checked here, where cuDNN would have checked them at finalization.

use phos_protocol::cudnn::CudnnStatus;
use phos_protocol::cudnn::consts::*;
use phos_protocol::spec::DeviceAccess;

use super::cudnn_legacy::span_bytes;
use super::cudnn_ops::Range;
use super::{CallCx, Session};
use crate::cpu_dnn::{self, ConvGeometry};
use crate::registry::dnn::{Descriptor, DnnHandle, TensorShape};

// cudnnBackendDescriptorType_t.
const ENGINE: i32 = 2;
const ENGINEHEUR: i32 = 4;
const CONVOLUTION_FORWARD: i32 = 10;
// cudnnBackendAttributeName_t.
const CONV_MODE: i32 = 101;
const CONV_DILATIONS: i32 = 102;
const CONV_FILTER_STRIDES: i32 = 103;
const CONV_POST_PADDINGS: i32 = 104;
const CONV_PRE_PADDINGS: i32 = 105;
const HEUR_OPERATION_GRAPH: i32 = 201;
const ENGINECFG_ENGINE: i32 = 300;
const PLAN_ENGINE_CONFIG: i32 = 401;
const FWD_ALPHA: i32 = 700;
const FWD_BETA: i32 = 701;
const FWD_CONV_DESC: i32 = 702;
const FWD_W: i32 = 703;
const FWD_X: i32 = 704;
const FWD_Y: i32 = 705;
const GRAPH_OPS: i32 = 801;
const TENSOR_DATA_TYPE: i32 = 901;
const TENSOR_DIMS: i32 = 902;
const TENSOR_STRIDES: i32 = 903;
const TENSOR_UID: i32 = 906;
const PACK_UIDS: i32 = 1000;
const PACK_POINTERS: i32 = 1001;
const ENGINE_OPERATION_GRAPH: i32 = 1300;

/// Why a graph is not run: needs cuDNN (what), or a bad argument (why).
enum Refusal {
    Unsupported(String),
    Bad(String),
}

type Walk<T> = Result<T, Refusal>;

fn bad<T>(why: String) -> Walk<T> {
    Err(Refusal::Bad(why))
}

/// The 64-bit integers of an attribute.
fn int64s(d: &Descriptor, name: i32) -> Walk<Vec<i64>> {
    match d.attributes.get(&name) {
        Some(a) if a.ty == CUDNN_TYPE_INT64 => {
            Ok(a.elements.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
        }
        _ => bad(format!("attribute {name} (INT64) of a descriptor of type {} not set", d.kind)),
    }
}

/// The one 32-bit enumerator of an attribute of type `ty`.
fn enum32(d: &Descriptor, name: i32, ty: i32) -> Walk<i32> {
    match d.attributes.get(&name) {
        Some(a) if a.ty == ty && a.elements.len() >= 4 => {
            Ok(i32::from_le_bytes(a.elements[..4].try_into().unwrap_or([0; 4])))
        }
        _ => bad(format!("attribute {name} of a descriptor of type {} not set", d.kind)),
    }
}

/// A scaling factor: float or double, 1 (alpha) or 0 (beta) where not set.
fn scale(d: &Descriptor, name: i32, default: f64) -> Walk<f64> {
    match d.attributes.get(&name) {
        None => Ok(default),
        Some(a) if a.ty == CUDNN_TYPE_FLOAT && a.elements.len() >= 4 => {
            Ok(f64::from(f32::from_le_bytes(a.elements[..4].try_into().unwrap_or([0; 4]))))
        }
        Some(a) if a.ty == CUDNN_TYPE_DOUBLE && a.elements.len() >= 8 => {
            Ok(f64::from_le_bytes(a.elements[..8].try_into().unwrap_or([0; 8])))
        }
        Some(a) => bad(format!("attribute {name} of type {}", a.ty)),
    }
}

/// The descriptors an attribute names.
fn named(d: &Descriptor, name: i32) -> Vec<u64> {
    d.attributes
        .get(&name)
        .filter(|a| a.ty == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        .map(|a| a.elements.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
        .unwrap_or_default()
}

/// A tensor descriptor's shape and unique id.
fn tensor(t: &Descriptor) -> Walk<(TensorShape, i64)> {
    let data_type = enum32(t, TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE)?;
    let dims = int64s(t, TENSOR_DIMS)?;
    let strides = int64s(t, TENSOR_STRIDES)?;
    let uid = *int64s(t, TENSOR_UID)?.first().ok_or_else(|| Refusal::Bad("a tensor without a unique id".into()))?;
    fn small(v: &[i64], least: i64) -> Option<Vec<i32>> {
        v.iter().map(|&x| i32::try_from(x).ok().filter(|&x| i64::from(x) >= least)).collect()
    }
    let (dims32, strides32) = (small(&dims, 1), small(&strides, 0));
    match (dims32, strides32) {
        (Some(dims), Some(strides)) if dims.len() == strides.len() && dims.len() >= 3 => {
            Ok((TensorShape { data_type, dims, strides }, uid))
        }
        _ => bad(format!("a tensor of dimensions {dims:?} and strides {strides:?}")),
    }
}

/// One convolution forward, ready for the CPU.
struct ConvForward {
    geometry: ConvGeometry,
    x: (TensorShape, u64),
    w: (TensorShape, u64),
    y: (TensorShape, u64),
    alpha: f64,
    beta: f64,
}

impl Session {
    /// A descriptor the walk reaches, hidden or not.
    fn dnn_kept(&self, handle: u64) -> Walk<Descriptor> {
        self.objects.dnn.kept_descriptor(handle).map_err(|_| Refusal::Bad(format!("{handle:#x} is gone")))
    }

    /// The one descriptor an attribute names.
    fn dnn_one(&self, d: &Descriptor, name: i32) -> Walk<Descriptor> {
        match named(d, name)[..] {
            [one] => self.dnn_kept(one),
            _ => bad(format!("attribute {name} of a descriptor of type {} does not name one descriptor", d.kind)),
        }
    }

    /// The operation graph of a plan: through its engine config's engine, or the heuristics
    /// that filled the config.
    fn dnn_plan_graph(&self, plan: &Descriptor) -> Walk<Descriptor> {
        let config = self.dnn_one(plan, PLAN_ENGINE_CONFIG)?;
        if config.attributes.contains_key(&ENGINECFG_ENGINE) {
            let engine = self.dnn_one(&config, ENGINECFG_ENGINE)?;
            if engine.kind != ENGINE {
                return bad(format!("the engine config names a descriptor of type {}", engine.kind));
            }
            return self.dnn_one(&engine, ENGINE_OPERATION_GRAPH);
        }
        for &r in &config.references {
            let source = self.dnn_kept(r)?;
            if source.kind == ENGINEHEUR {
                return self.dnn_one(&source, HEUR_OPERATION_GRAPH);
            }
        }
        bad("the plan's engine config has no engine".into())
    }

    /// The convolution forward a plan runs, with the variant pack's pointers.
    fn dnn_plan_conv(&self, plan: &Descriptor, pack: &Descriptor) -> Walk<ConvForward> {
        let graph = self.dnn_plan_graph(plan)?;
        let ops = named(&graph, GRAPH_OPS);
        let [op] = ops[..] else {
            return Err(Refusal::Unsupported(format!("a graph of {} operations", ops.len())));
        };
        let op = self.dnn_kept(op)?;
        if op.kind != CONVOLUTION_FORWARD {
            return Err(Refusal::Unsupported(format!("an operation of type {}", op.kind)));
        }
        let (x, x_uid) = tensor(&self.dnn_one(&op, FWD_X)?)?;
        let (w, w_uid) = tensor(&self.dnn_one(&op, FWD_W)?)?;
        let (y, y_uid) = tensor(&self.dnn_one(&op, FWD_Y)?)?;
        let conv = self.dnn_one(&op, FWD_CONV_DESC)?;
        let mode = enum32(&conv, CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE)?;
        let pre = int64s(&conv, CONV_PRE_PADDINGS)?;
        let post = int64s(&conv, CONV_POST_PADDINGS)?;
        let strides = int64s(&conv, CONV_FILTER_STRIDES)?;
        let dilations = int64s(&conv, CONV_DILATIONS)?;
        let spatial = x.dims.len() - 2;
        if [pre.len(), post.len(), strides.len(), dilations.len()].iter().any(|&l| l != spatial)
            || w.dims.len() != spatial + 2
            || y.dims.len() != spatial + 2
        {
            return bad(format!("a convolution of {spatial} spatial dimensions with tensors of other ranks"));
        }
        if pre.iter().chain(&post).any(|&p| p < 0) || strides.iter().chain(&dilations).any(|&s| s < 1) {
            return bad(format!("paddings {pre:?} {post:?}, strides {strides:?}, dilations {dilations:?}"));
        }
        let (n, c, k) = (x.dims[0], x.dims[1], w.dims[0]);
        let groups = if w.dims[1] > 0 && c % w.dims[1] == 0 { c / w.dims[1] } else { 0 };
        if groups == 0 || k % groups != 0 || y.dims[0] != n || y.dims[1] != k || !(0..=1).contains(&mode) {
            return bad(format!("x {:?}, w {:?}, y {:?} (mode {mode})", x.dims, w.dims, y.dims));
        }
        for d in 0..spatial {
            let extent = (i64::from(w.dims[d + 2]) - 1) * dilations[d] + 1;
            let padded = i64::from(x.dims[d + 2]) + pre[d] + post[d];
            if padded < extent || (padded - extent) / strides[d] + 1 != i64::from(y.dims[d + 2]) {
                return bad(format!("y {:?} is not what x {:?} and w {:?} make", y.dims, x.dims, w.dims));
            }
        }
        let uids = int64s(pack, PACK_UIDS)?;
        let pointers: Vec<u64> = pack
            .attributes
            .get(&PACK_POINTERS)
            .filter(|a| a.ty == CUDNN_TYPE_VOID_PTR)
            .map(|a| a.elements.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
            .unwrap_or_default();
        let at = |uid: i64| match uids.iter().position(|&u| u == uid).and_then(|i| pointers.get(i)) {
            Some(&p) if p != 0 => Ok(p),
            _ => bad(format!("the variant pack has no pointer for tensor {uid}")),
        };
        let u = |v: &[i32]| v.iter().map(|&d| d as usize).collect::<Vec<_>>();
        let geometry = ConvGeometry {
            n: n as usize,
            c: c as usize,
            k: k as usize,
            groups: groups as usize,
            input: u(&x.dims[2..]),
            filter: u(&w.dims[2..]),
            output: u(&y.dims[2..]),
            pads: pre,
            strides,
            dilations,
            flip: mode == 0,
        };
        let (alpha, beta) = (scale(&op, FWD_ALPHA, 1.0)?, scale(&op, FWD_BETA, 0.0)?);
        Ok(ConvForward { geometry, x: (x, at(x_uid)?), w: (w, at(w_uid)?), y: (y, at(y_uid)?), alpha, beta })
    }

    /// Run a finalized plan with its variant pack on the CPU (`emu`), after the checks every
    /// execution gets (`access`: what the pack's pointers lie in).
    pub(super) fn dnn_graph_cpu(
        &self,
        cx: &CallCx,
        h: &DnnHandle,
        plan: &Descriptor,
        pack: &Descriptor,
        access: &[DeviceAccess],
    ) -> Result<(), CudnnStatus> {
        let conv = match self.dnn_plan_conv(plan, pack) {
            Ok(conv) => conv,
            Err(Refusal::Unsupported(what)) => {
                return Err(self.dnn_refuse(
                    cx,
                    CudnnStatus::NOT_SUPPORTED,
                    format_args!("{what} (the CPU implementation runs one convolution forward; the rest needs cuDNN)"),
                ));
            }
            Err(Refusal::Bad(why)) => return Err(self.dnn_bad(cx, format_args!("{why}"))),
        };
        let ((x, xa), (w, wa), (y, ya)) = (&conv.x, &conv.w, &conv.y);
        self.dnn_same_types(cx, &[("x", x), ("w", w), ("y", y)])?;
        self.dnn_cpu_takes(cx, &[x, w, y])?;
        self.dnn_ranges(
            cx,
            &[
                Range::read("x", *xa, span_bytes(x)),
                Range::read("w", *wa, span_bytes(w)),
                Range::write("y", *ya, span_bytes(y)),
            ],
        )?;
        self.dnn_work(cx, h)?;
        self.before_work("cudnnBackendExecute", access).map_err(super::cudnn::dnn_status)?;
        let t = self.dnn_cpu(h)?;
        let result = cpu_dnn::conv_forward(&conv.geometry, &t.load(*xa, x)?, &t.load(*wa, w)?);
        t.blend_store(*ya, y, conv.alpha, &result, conv.beta)
    }
}

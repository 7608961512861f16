//! Kernel parameter layouts from a cubin's `.nv.info.<kernel>` sections.
//!
//! A cubin is an ELF image (`e_machine` 190). Each kernel is a `STT_FUNC` symbol whose
//! `st_other` has the [`STO_CUDA_ENTRY`] bit (device functions compiled with `-rdc` also get
//! `.nv.info.<name>` sections, but not that bit), and its attributes live in the section
//! `.nv.info.<mangled name>` (type `SHT_LOPROC`, `sh_info` = the index of `.text.<mangled
//! name>`).
//!
//! An attribute stream is a sequence of records, each starting with a 4-byte head:
//!
//! | byte | meaning |
//! |------|---------|
//! | 0    | format: 1 `EIFMT_NVAL`, 2 `EIFMT_BVAL`, 3 `EIFMT_HVAL`, 4 `EIFMT_SVAL` |
//! | 1    | attribute id (`EIATTR_*`) |
//! | 2..4 | `u16`: for `SVAL` the length of the value that follows; for `HVAL` the value itself; for `BVAL` the value in its low byte; unused (0) for `NVAL` |
//!
//! so `NVAL`, `BVAL` and `HVAL` records are exactly 4 bytes and `SVAL` records 4 + length bytes.
//! (No `BVAL` record occurs in any binary seen; its layout follows from every record head being
//! 4 bytes.)
//!
//! The attributes this module interprets:
//!
//! * `EIATTR_KPARAM_INFO` (0x17, `SVAL`, 12 bytes), one per parameter, listed in *descending*
//!   ordinal order: `u32` index (0), `u16` ordinal, `u16` offset in the parameter buffer, `u32`
//!   packed word with the pointee's log2 alignment in bits 0..8 and a space in bits 8..12 (both
//!   0 in every binary seen), the constant bank (0x1f) in bits 12..17 and the parameter size in
//!   bytes in bits 18..32; `cuobjdump -elf` prints the same numbers.
//! * `EIATTR_KPARAM_INFO_V2` (0x45, `SVAL`, 12 bytes), emitted by CUDA 13 (and, by public
//!   reports, late 12.x) instead of the former for every parameter of a kernel whose parameters
//!   do not fit the old encoding (seen for a 20000-byte by-value parameter, which the 14-bit
//!   size field cannot hold): `u32` index, `u16` ordinal, `u16` offset, `u16` size in bytes,
//!   `u16` flags (0 in the binaries seen).
//! * `EIATTR_CBANK_PARAM_SIZE` (0x19, `HVAL`): the size of the parameter buffer.
//! * `EIATTR_PARAM_CBANK` (0x0a, `SVAL`, 8 bytes): `u32` symbol index of the kernel's
//!   `.nv.constant0` section, `u16` offset of the parameters in constant bank 0 (e.g. 0x140 on
//!   sm_52, 0x160 on sm_80, 0x210 on sm_90), `u16` parameter buffer size.
//!
//! Kernels without parameters have neither of the last two nor any `KPARAM_INFO`.

use std::collections::HashMap;

use crate::FatbinError;
use crate::bytes::{u16_at, u32_at};
use crate::elf::{EM_CUDA, Elf, SHT_CUDA_INFO, STO_CUDA_ENTRY, STT_FUNC, Section};

/// `EIFMT_NVAL`: no value.
pub const EIFMT_NVAL: u8 = 0x01;
/// `EIFMT_BVAL`: a byte value.
pub const EIFMT_BVAL: u8 = 0x02;
/// `EIFMT_HVAL`: a 16-bit value.
pub const EIFMT_HVAL: u8 = 0x03;
/// `EIFMT_SVAL`: a sized value.
pub const EIFMT_SVAL: u8 = 0x04;

/// Parameter bank location and size.
pub const EIATTR_PARAM_CBANK: u8 = 0x0a;
/// One kernel parameter (ordinal, offset, size).
pub const EIATTR_KPARAM_INFO: u8 = 0x17;
/// Size of the parameter buffer.
pub const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
/// CUDA API version the kernel was compiled for (e.g. 0x76 = 118 for CUDA 11.8).
pub const EIATTR_CUDA_API_VERSION: u8 = 0x37;
/// One kernel parameter, wide-size encoding used for large by-value parameters.
pub const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

/// The value of one `.nv.info` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrValue<'a> {
    /// `EIFMT_NVAL`.
    None,
    /// `EIFMT_BVAL`.
    Byte(u8),
    /// `EIFMT_HVAL`.
    Half(u16),
    /// `EIFMT_SVAL`: the value bytes.
    Bytes(&'a [u8]),
}

/// One `.nv.info` attribute record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribute<'a> {
    /// Offset of the record within its section.
    pub offset: usize,
    /// `EIFMT_*`.
    pub format: u8,
    /// `EIATTR_*`.
    pub id: u8,
    pub value: AttrValue<'a>,
}

/// Iterator over the attribute records of an `.nv.info` section; see [`attributes`].
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    section: &'a str,
    data: &'a [u8],
    pos: usize,
    failed: bool,
}

/// The attribute records of an `.nv.info` or `.nv.info.<kernel>` section. Iteration stops after
/// the first error.
pub fn attributes<'a>(section: &Section<'a>) -> Attributes<'a> {
    Attributes { section: section.name, data: section.data, pos: 0, failed: false }
}

impl<'a> Attributes<'a> {
    fn error(&mut self, offset: usize, reason: String) -> Option<Result<Attribute<'a>, FatbinError>> {
        self.failed = true;
        Some(Err(FatbinError::NvInfo { section: self.section.to_owned(), offset, reason }))
    }
}

impl<'a> Iterator for Attributes<'a> {
    type Item = Result<Attribute<'a>, FatbinError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.data.len() {
            return None;
        }
        let at = self.pos;
        let (Some(&format), Some(&id), Some(word)) =
            (self.data.get(at), self.data.get(at + 1), u16_at(self.data, at + 2))
        else {
            return self.error(at, format!("attribute head needs 4 bytes, {} left", self.data.len() - at));
        };
        let value = match format {
            EIFMT_NVAL => AttrValue::None,
            EIFMT_BVAL => AttrValue::Byte(word as u8),
            EIFMT_HVAL => AttrValue::Half(word),
            EIFMT_SVAL => {
                let start = at + 4;
                let Some(bytes) = self.data.get(start..start + usize::from(word)) else {
                    return self
                        .error(at, format!("attribute {id:#x} value of {word} bytes runs past the section end"));
                };
                self.pos = start + usize::from(word);
                return Some(Ok(Attribute { offset: at, format, id, value: AttrValue::Bytes(bytes) }));
            }
            other => return self.error(at, format!("unknown attribute format {other:#x}")),
        };
        self.pos = at + 4;
        Some(Ok(Attribute { offset: at, format, id, value }))
    }
}

impl std::iter::FusedIterator for Attributes<'_> {}

/// One kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Param {
    /// Position in the kernel's parameter list, from 0.
    pub ordinal: u16,
    /// Byte offset in the parameter buffer (already aligned for the parameter's type).
    pub offset: u16,
    /// Size in bytes; a struct passed by value is one parameter of the struct's size.
    pub size: u16,
}

impl Param {
    /// One past the parameter's last byte in the buffer.
    pub fn end(&self) -> u32 {
        u32::from(self.offset) + u32::from(self.size)
    }
}

/// A kernel and the layout of its parameter buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelParams {
    /// The kernel's symbol name (mangled for C++ kernels, plain for `extern "C"`).
    pub name: String,
    /// The parameters, sorted by ordinal; `params[i].ordinal == i`.
    pub params: Vec<Param>,
    /// Size of the parameter buffer in bytes: the attribute `EIATTR_CBANK_PARAM_SIZE` (or the
    /// size in `EIATTR_PARAM_CBANK`) when present, else the end of the last parameter. Every
    /// parameter lies inside it. Not rounded up: a `(double, char)` kernel has 9.
    pub buffer_size: u32,
}

impl KernelParams {
    /// Packs one value per parameter (in ordinal order, each exactly the parameter's size)
    /// into a parameter buffer of [`buffer_size`](Self::buffer_size) bytes, padding with zeros.
    /// This is what the guest does with the `void **args` of `cudaLaunchKernel` after reading
    /// `params[i].size` bytes from `args[i]`.
    pub fn pack(&self, args: &[&[u8]]) -> Result<Vec<u8>, FatbinError> {
        if args.len() != self.params.len() {
            return Err(FatbinError::Arguments {
                kernel: self.name.clone(),
                reason: format!("{} arguments given, the kernel has {} parameters", args.len(), self.params.len()),
            });
        }
        let mut buffer = vec![0u8; self.buffer_size as usize];
        for (param, arg) in self.params.iter().zip(args) {
            if arg.len() != usize::from(param.size) {
                return Err(FatbinError::Arguments {
                    kernel: self.name.clone(),
                    reason: format!(
                        "argument {} has {} bytes, the parameter has {}",
                        param.ordinal,
                        arg.len(),
                        param.size
                    ),
                });
            }
            // In bounds: `kernels` checks that every parameter ends inside the buffer, and the
            // fields are public, so check again rather than trust them.
            let Some(slot) = buffer.get_mut(usize::from(param.offset)..param.end() as usize) else {
                return Err(FatbinError::Arguments {
                    kernel: self.name.clone(),
                    reason: format!("parameter {} ends past the buffer of {} bytes", param.ordinal, self.buffer_size),
                });
            };
            slot.copy_from_slice(arg);
        }
        Ok(buffer)
    }
}

/// Every kernel of a cubin with its parameter layout, sorted by name.
pub fn kernels(elf: &[u8]) -> Result<Vec<KernelParams>, FatbinError> {
    let image = Elf::parse(elf)?;
    if image.header().machine != EM_CUDA {
        return Err(FatbinError::NotCubin { machine: image.header().machine });
    }
    // Indexed once: library cubins hold thousands of kernels and sections.
    let info_sections: HashMap<&str, &Section<'_>> = image
        .sections()
        .iter()
        .filter(|s| s.sh_type == SHT_CUDA_INFO)
        .filter_map(|s| Some((s.name.strip_prefix(".nv.info.")?, s)))
        .collect();
    let mut kernels = Vec::new();
    for symbol in image.symbols()? {
        if symbol.kind() != STT_FUNC || symbol.other & STO_CUDA_ENTRY == 0 {
            continue;
        }
        kernels.push(kernel_params(symbol.name, info_sections.get(symbol.name).copied())?);
    }
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(kernels)
}

/// Reads one kernel's parameters from its `.nv.info.<kernel>` section (absent: no parameters).
fn kernel_params(name: &str, info: Option<&Section<'_>>) -> Result<KernelParams, FatbinError> {
    let mut params = Vec::new();
    let mut cbank_param_size = None;
    let mut param_cbank_size = None;
    if let Some(section) = info {
        for attribute in attributes(section) {
            let attribute = attribute?;
            let bad = |reason: &str| FatbinError::NvInfo {
                section: section.name.to_owned(),
                offset: attribute.offset,
                reason: format!("attribute {:#x}: {reason}", attribute.id),
            };
            match (attribute.id, attribute.value) {
                (EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2, AttrValue::Bytes(v)) => {
                    let (Some(ordinal), Some(offset), Some(word)) = (u16_at(v, 4), u16_at(v, 6), u32_at(v, 8)) else {
                        return Err(bad(&format!("parameter info has {} bytes, expected 12", v.len())));
                    };
                    let size = if attribute.id == EIATTR_KPARAM_INFO { (word >> 18) as u16 } else { word as u16 };
                    params.push(Param { ordinal, offset, size });
                }
                (EIATTR_CBANK_PARAM_SIZE, AttrValue::Half(size)) => cbank_param_size = Some(u32::from(size)),
                (EIATTR_PARAM_CBANK, AttrValue::Bytes(v)) => {
                    let size = u16_at(v, 6).ok_or_else(|| bad("parameter bank value shorter than 8 bytes"))?;
                    param_cbank_size = Some(u32::from(size));
                }
                (EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2 | EIATTR_CBANK_PARAM_SIZE | EIATTR_PARAM_CBANK, _) => {
                    return Err(bad(&format!("unexpected format {:#x}", attribute.format)));
                }
                _ => {}
            }
        }
    }

    let invalid = |reason: String| FatbinError::KernelParams { kernel: name.to_owned(), reason };
    params.sort_by_key(|p| p.ordinal);
    for (i, p) in params.iter().enumerate() {
        if usize::from(p.ordinal) != i {
            return Err(invalid(format!(
                "parameter ordinals are not 0..{}: found {} at position {i}",
                params.len(),
                p.ordinal
            )));
        }
    }
    let end = params.iter().map(Param::end).max().unwrap_or(0);
    let buffer_size = match (cbank_param_size, param_cbank_size) {
        (Some(a), Some(b)) if a != b => {
            return Err(invalid(format!("parameter buffer size is {a} in CBANK_PARAM_SIZE but {b} in PARAM_CBANK")));
        }
        (Some(size), _) | (None, Some(size)) => size,
        (None, None) => end,
    };
    if let Some(p) = params.iter().find(|p| p.end() > buffer_size) {
        return Err(invalid(format!(
            "parameter {} (offset {}, size {}) ends past the parameter buffer of {buffer_size} bytes",
            p.ordinal, p.offset, p.size
        )));
    }
    Ok(KernelParams { name: name.to_owned(), params, buffer_size })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::tests::{build_elf, symtab};

    /// The `.nv.info.mixed_kernel` section of the sm_80 cubin nvcc 11.8 builds from
    /// `tests/data/kernels.cu` (`mixed_kernel(const float *, float *, int, Mixed)`).
    const MIXED_KERNEL_SM80: &[u8] = &[
        0x04, 0x37, 0x04, 0x00, 0x76, 0x00, 0x00, 0x00, 0x01, 0x35, 0x00, 0x00, 0x04, 0x0a, 0x08, 0x00, 0x10, 0x00,
        0x00, 0x00, 0x60, 0x01, 0x30, 0x00, 0x03, 0x19, 0x30, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x03, 0x00, 0x18, 0x00, 0x00, 0xf0, 0x61, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
        0x10, 0x00, 0x00, 0xf0, 0x11, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x08, 0x00,
        0x00, 0xf0, 0x21, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0,
        0x21, 0x00, 0x03, 0x1b, 0xff, 0x00, 0x04, 0x1c, 0x08, 0x00, 0x50, 0x00, 0x00, 0x00, 0xb0, 0x01, 0x00, 0x00,
    ];

    /// `KPARAM_INFO_V2` records as CUDA 13 writes them for
    /// `huge2(char, Huge /* 20000 bytes */, double, int *, short, Mid /* 16 bytes */)`.
    fn huge_kernel_info() -> Vec<u8> {
        let mut info = vec![0x04, 0x37, 0x04, 0x00, 0x82, 0x00, 0x00, 0x00];
        info.extend([0x04, 0x0a, 0x08, 0x00, 0x06, 0x00, 0x00, 0x00, 0x80, 0x1a, 0x50, 0x4e]);
        info.extend([0x03, 0x19, 0x50, 0x4e]);
        for (ordinal, offset, size) in
            [(5u16, 0x4e40u16, 16u32), (4, 0x4e38, 2), (3, 0x4e30, 8), (2, 0x4e28, 8), (1, 1, 20000), (0, 0, 1)]
        {
            info.extend([0x04, 0x45, 0x0c, 0x00, 0, 0, 0, 0]);
            info.extend(ordinal.to_le_bytes());
            info.extend(offset.to_le_bytes());
            info.extend(size.to_le_bytes());
        }
        info.extend([0x03, 0x1b, 0xff, 0x00]);
        info
    }

    /// A cubin-like ELF image with one `.text.<name>` per kernel, its symbol (with `st_other`
    /// as given) and optionally its `.nv.info.<name>`.
    fn cubin(kernels: &[(&str, u8, Option<Vec<u8>>)]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut syms = Vec::new();
        // Section indices in `build_elf` images are the position in this list plus one.
        let mut sections: Vec<(String, u32, u32, u32, Vec<u8>)> =
            vec![(".strtab".into(), 3, 0, 0, Vec::new()), (".symtab".into(), crate::elf::SHT_SYMTAB, 1, 0, Vec::new())];
        for (name, other, info) in kernels {
            let text_index = sections.len() as u16 + 1;
            syms.push((strtab.len() as u32, 0x12, *other, text_index));
            strtab.extend(name.as_bytes());
            strtab.push(0);
            sections.push((format!(".text.{name}"), 1, 0, 0, vec![0; 16]));
            if let Some(info) = info {
                sections.push((format!(".nv.info.{name}"), SHT_CUDA_INFO, 0, u32::from(text_index), info.clone()));
            }
        }
        sections[0].4 = strtab;
        sections[1].4 = symtab(&syms);
        let borrowed: Vec<_> = sections.iter().map(|(n, t, l, i, b)| (n.as_str(), *t, *l, *i, b.clone())).collect();
        build_elf(EM_CUDA, &borrowed)
    }

    #[test]
    fn decodes_attribute_records() {
        let section = Section {
            index: 1,
            name: ".nv.info.mixed_kernel",
            sh_type: SHT_CUDA_INFO,
            flags: 0,
            addr: 0,
            offset: 0,
            size: MIXED_KERNEL_SM80.len() as u64,
            link: 0,
            info: 0,
            entsize: 0,
            data: MIXED_KERNEL_SM80,
        };
        let attrs: Vec<_> = attributes(&section).collect::<Result<_, _>>().unwrap();
        let ids: Vec<_> = attrs.iter().map(|a| (a.id, a.offset)).collect();
        assert_eq!(
            ids,
            [
                (0x37, 0),
                (0x35, 8),
                (0x0a, 12),
                (0x19, 24),
                (0x17, 28),
                (0x17, 44),
                (0x17, 60),
                (0x17, 76),
                (0x1b, 92),
                (0x1c, 96)
            ]
        );
        assert_eq!(attrs[0].value, AttrValue::Bytes(&[0x76, 0, 0, 0]));
        assert_eq!(attrs[1].value, AttrValue::None);
        assert_eq!(attrs[3].value, AttrValue::Half(0x30));
    }

    #[test]
    fn attribute_errors_carry_offsets() {
        let mut section = Section {
            index: 1,
            name: ".nv.info.k",
            sh_type: SHT_CUDA_INFO,
            flags: 0,
            addr: 0,
            offset: 0,
            size: 0,
            link: 0,
            info: 0,
            entsize: 0,
            data: &[0x03, 0x19, 0x30, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00],
        };
        let results: Vec<_> = attributes(&section).collect();
        assert_eq!(results.len(), 2);
        assert!(matches!(&results[1], Err(FatbinError::NvInfo { offset: 4, .. })));
        section.data = &[0x03, 0x19, 0x30, 0x00, 0x07, 0x01, 0x00, 0x00];
        assert!(matches!(attributes(&section).nth(1), Some(Err(FatbinError::NvInfo { offset: 4, .. }))));
        section.data = &[0x03, 0x19, 0x30];
        assert!(matches!(attributes(&section).next(), Some(Err(FatbinError::NvInfo { offset: 0, .. }))));
    }

    #[test]
    fn kernel_layouts_from_synthetic_cubin() {
        let image = cubin(&[
            ("mixed_kernel", STO_CUDA_ENTRY, Some(MIXED_KERNEL_SM80.to_vec())),
            ("no_params", STO_CUDA_ENTRY, Some(vec![0x04, 0x37, 0x04, 0x00, 0x76, 0x00, 0x00, 0x00])),
            ("huge2", STO_CUDA_ENTRY, Some(huge_kernel_info())),
            ("_Z6helperi", 0, Some(vec![0x04, 0x37, 0x04, 0x00, 0x82, 0x00, 0x00, 0x00])),
            ("no_info", STO_CUDA_ENTRY, None),
        ]);
        let kernels = kernels(&image).unwrap();
        let names: Vec<_> = kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["huge2", "mixed_kernel", "no_info", "no_params"]);

        let mixed = &kernels[1];
        let layout: Vec<_> = mixed.params.iter().map(|p| (p.ordinal, p.offset, p.size)).collect();
        assert_eq!(layout, [(0, 0, 8), (1, 8, 8), (2, 16, 4), (3, 24, 24)]);
        assert_eq!(mixed.buffer_size, 48);

        let huge = &kernels[0];
        let layout: Vec<_> = huge.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(layout, [(0, 1), (1, 20000), (0x4e28, 8), (0x4e30, 8), (0x4e38, 2), (0x4e40, 16)]);
        assert_eq!(huge.buffer_size, 0x4e50);

        assert!(kernels[2].params.is_empty() && kernels[2].buffer_size == 0);
        assert!(kernels[3].params.is_empty() && kernels[3].buffer_size == 0);
    }

    #[test]
    fn inconsistent_parameter_metadata_is_rejected() {
        let record = |ordinal: u16, offset: u16, size: u32| {
            let mut r = vec![0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0];
            r.extend(ordinal.to_le_bytes());
            r.extend(offset.to_le_bytes());
            r.extend((size << 18 | 0x1f000).to_le_bytes());
            r
        };
        let duplicate = [record(0, 0, 4), record(0, 4, 4)].concat();
        let gap = [record(0, 0, 4), record(2, 8, 4)].concat();
        let overflow = [vec![0x03, 0x19, 0x04, 0x00], record(0, 0, 8)].concat();
        let disagree =
            [vec![0x03, 0x19, 0x08, 0x00, 0x04, 0x0a, 0x08, 0x00, 0, 0, 0, 0, 0x40, 0x01, 0x10, 0x00], record(0, 0, 8)]
                .concat();
        let short = vec![0x04, 0x17, 0x08, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
        let wrong_format = vec![0x04, 0x19, 0x02, 0x00, 0x08, 0x00];
        for (what, info) in [("duplicate", duplicate), ("gap", gap), ("overflow", overflow), ("disagree", disagree)] {
            let err = kernels(&cubin(&[("k", STO_CUDA_ENTRY, Some(info))])).unwrap_err();
            assert!(matches!(err, FatbinError::KernelParams { .. }), "{what}: {err}");
        }
        for info in [short, wrong_format] {
            let err = kernels(&cubin(&[("k", STO_CUDA_ENTRY, Some(info))])).unwrap_err();
            assert!(matches!(err, FatbinError::NvInfo { .. }), "{err}");
        }
    }

    #[test]
    fn host_elf_is_not_a_cubin() {
        let image = build_elf(62, &[(".text", 1, 0, 0, vec![0x90])]);
        assert_eq!(kernels(&image), Err(FatbinError::NotCubin { machine: 62 }));
    }

    #[test]
    fn pack_places_arguments_at_their_offsets() {
        let kernel = KernelParams {
            name: "k".into(),
            params: vec![
                Param { ordinal: 0, offset: 0, size: 8 },
                Param { ordinal: 1, offset: 8, size: 4 },
                Param { ordinal: 2, offset: 16, size: 1 },
            ],
            buffer_size: 17,
        };
        let buffer = kernel.pack(&[&[1; 8], &[2; 4], &[3]]).unwrap();
        assert_eq!(buffer, [1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 3]);
        assert!(matches!(kernel.pack(&[&[1; 8], &[2; 4]]), Err(FatbinError::Arguments { .. })));
        assert!(matches!(kernel.pack(&[&[1; 8], &[2; 3], &[3]]), Err(FatbinError::Arguments { .. })));
        let broken = KernelParams { buffer_size: 10, ..kernel };
        assert!(matches!(broken.pack(&[&[1; 8], &[2; 4], &[3]]), Err(FatbinError::Arguments { .. })));
    }
}

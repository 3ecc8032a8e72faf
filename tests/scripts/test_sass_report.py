"""scripts/sass_report.py's reading of a cuobjdump listing (no cuobjdump or GPU needed): the
functions, each instruction's opcode, loops from backward branches with the counted
instructions inside, and the span of a loop-free vector path."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
import sass_report as sr  # noqa: E402

LISTING = """
	code for sm_90a
		Function : _Z4loopPi
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ; /* 0x0000000402047981 */
        /*0020*/                   LDS.U16 R8, [R9] ;                   /* 0x0000000009087984 */
        /*0030*/              @!P0 LDG.E.U8 R10, desc[UR4][R2.64+0x1] ; /* 0x000001040210a981 */
        /*0040*/                   HMMA.16816.F32.BF16 R12, R4, R6, R12 ; /* 0x000000060408723c */
        /*0050*/               @P1 BRA 0x20 ;                           /* 0xfffffffc00001947 */
        /*0060*/                   STG.E.128 desc[UR4][R2.64], R4 ;     /* 0x0000000402007986 */
        /*0070*/                   BRA 0x70;                            /* 0xfffffffc00007947 */
		Function : _Z8straightPi
        /*0000*/                   LDG.E.64 R4, desc[UR4][R2.64] ;      /* 0x0000000402047981 */
        /*0010*/                   PRMT R6, R4, 0x1100, RZ ;            /* 0x0000110004067816 */
        /*0020*/                   STG.E.128 desc[UR4][R2.64], R4 ;     /* 0x0000000402007986 */
        /*0030*/                   EXIT ;                               /* 0x000000000000794d */
"""


def test_functions_and_opcodes():
    f = sr.parse_functions(LISTING)
    assert list(f) == ["_Z4loopPi", "_Z8straightPi"]
    assert [op for _, op, _ in f["_Z4loopPi"]] == ["LDC", "LDG.E.128.CONSTANT", "LDS.U16", "LDG.E.U8",
                                                   "HMMA.16816.F32.BF16", "BRA", "STG.E.128", "BRA"]


def test_loops_and_counts():
    d = sr.describe(sr.parse_functions(LISTING)["_Z4loopPi"])
    assert d["instructions"] == 8
    # the branch to itself at 0x70 (the end-of-kernel trap) is not a loop
    assert [(lp["from"], lp["to"], lp["instructions"]) for lp in d["loops"]] == [("0x20", "0x50", 4)]
    body = d["loops"][0]
    assert (body["lds"], body["hmma"], body["byte_loads"], body["ldg_16B"]) == (1, 1, 1, 0)
    assert (d["ldg_16B"], d["stg_16B"]) == (1, 1)


def test_vector_span():
    f = sr.parse_functions(LISTING)
    assert sr.describe(f["_Z8straightPi"])["vector_span"] == 3
    assert sr.vector_span([]) is None

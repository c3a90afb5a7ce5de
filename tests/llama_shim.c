/* Two entry points into libllama for the tests (tests/llama_oracle.py): llama-quantize's own
 * quantizer with its options, and a model's logits for a few tokens. Plain C arguments only, so
 * that ctypes needs none of llama.h's structs. */
#include "llama.h"

#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

/* llama_model_quantize(inp, out) as llama-quantize runs it; a type < 0 keeps the default. */
int aq_quantize(const char * inp, const char * out, int ftype, int pure, int output_type, int embd_type,
                const char ** patterns, const int * types, int n_patterns, const char ** imat_names,
                const float ** imat_data, const size_t * imat_sizes, int n_imat) {
    llama_log_set(quiet, NULL);
    struct llama_model_quantize_params p = llama_model_quantize_default_params();
    p.nthread = 1;
    p.ftype = (enum llama_ftype) ftype;
    p.pure = pure != 0;
    if (output_type >= 0) {
        p.output_tensor_type = (enum ggml_type) output_type;
    }
    if (embd_type >= 0) {
        p.token_embedding_type = (enum ggml_type) embd_type;
    }
    struct llama_model_tensor_override * tt = calloc((size_t) n_patterns + 1, sizeof *tt);
    struct llama_model_imatrix_data * im = calloc((size_t) n_imat + 1, sizeof *im);
    if (tt == NULL || im == NULL) {
        free(tt);
        free(im);
        return -2;
    }
    for (int i = 0; i < n_patterns; ++i) {
        tt[i].pattern = patterns[i];
        tt[i].type = (enum ggml_type) types[i];
    }
    for (int i = 0; i < n_imat; ++i) {
        im[i].name = imat_names[i];
        im[i].data = imat_data[i];
        im[i].size = imat_sizes[i];
    }
    if (n_patterns > 0) {
        p.tt_overrides = tt;
    }
    if (n_imat > 0) {
        p.imatrix = im;
    }
    uint32_t rc = llama_model_quantize(inp, out, &p);
    free(tt);
    free(im);
    return (int) rc;
}

/* The logits after each of n tokens, decoded one at a time on one CPU thread: out[i * n_vocab + j]. */
int aq_logits(const char * path, const int32_t * tokens, int n, float * out, int n_vocab) {
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (model == NULL) {
        return -1;
    }
    if (llama_vocab_n_tokens(llama_model_get_vocab(model)) != n_vocab) {
        llama_model_free(model);
        return -2;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 64;
    cp.n_ubatch = 64;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        llama_model_free(model);
        return -3;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; ++i) {
        llama_token tok = tokens[i];
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
            rc = -4;
            break;
        }
        memcpy(out + (size_t) i * (size_t) n_vocab, llama_get_logits_ith(ctx, -1), sizeof(float) * (size_t) n_vocab);
    }
    llama_free(ctx);
    llama_model_free(model);
    return rc;
}

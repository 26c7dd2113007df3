/* The QAD run's private layout, shared by qad/qad.c (the training step) and qad/checkpoint.c
 * (save / restore of everything a bit-exact resume needs). */
#ifndef NIBBLE_QAD_INTERNAL_H
#define NIBBLE_QAD_INTERNAL_H

#include "nibble/qad.h"
#include "nibble/optim.h"

struct nb_qad {
    nb_qad_cfg cfg;
    nb_model *teacher, *sm;      /* teacher and the student's model */
    nb_qmodel *qm;
    nb_dataloader *ld;           /* may be NULL */
    nb_adamw *opt;
    int32_t n;                   /* student parameters (all of them are in the optimizer) */
    nb_tensor **grads;           /* [n]: the gradient view of a trained parameter, NULL when frozen */
    int64_t step;                /* optimizer steps taken */
    nb_lr_schedule sched;
    /* teacher side of the current micro-batch */
    float **thidden;             /* n_layers + 1 pointers for the teacher forward, only the last set */
    float *th;                   /* teacher final-norm hidden states [rows, hidden] */
    size_t th_floats;
    float *tl;                   /* one chunk of teacher logits */
    size_t tl_floats;
    const float *tW, *tb;        /* teacher lm_head weight [V, D] and bias (NULL) */
    /* the micro-batch the loss callback is working on */
    const int32_t *targets;
    const uint8_t *mask;
    int64_t rows;
    nb_distill_state st;
    /* batches of one optimizer step */
    nb_data_batch *batches;
};

/* Settings a checkpoint must agree with, as "key=value" lines (checkpoint.c compares them). */
char *nb_qad_settings_text(const nb_qad *q);

#endif

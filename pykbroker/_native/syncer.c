/*
 * syncer: fdatasync in native threads that never take the GIL, completions signalled on an eventfd.
 *
 * With log.flush.on.ack every acknowledged produce waits for an fsync.  Run in a Python thread, each
 * fsync needs that thread to win the GIL back from the event loop before it can report, and under CPU
 * contention that hand-off (thread wake-ups, GIL transfers, the loop's self-pipe) cost more broker CPU
 * than the request itself (docs/performance.md, "What starved").  Here a job is a list of descriptors
 * that the caller has duplicated for the purpose: a worker thread fdatasyncs them (fsync for the
 * directory), closes them, queues (token, errno) and writes to an eventfd that the event loop watches.
 * The loop then collects every finished job with one call.  pykbroker/replica/group_commit.py uses it
 * when built and falls back to Python threads otherwise.
 *
 * Syncer(max_threads)
 *   .fileno()                      the eventfd (non-blocking) to watch for readability
 *   .submit(token, fds, dir_fd)    queue a job; fds (a tuple of ints) and dir_fd (-1: none) are owned
 *                                  by the syncer from then on and closed after the sync
 *   .completed() -> [(token, errno)]  finished jobs (errno 0: all synced), draining the eventfd
 *   .close()                       stop the idle threads and close the eventfd (jobs in progress end first)
 * Threads start on demand (one more whenever every thread is busy, up to max_threads) and exit after
 * IDLE_EXIT_S seconds without work.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define IDLE_EXIT_S 10

typedef struct job {
    struct job *next;
    long long token;
    int dir_fd;
    int err;
    Py_ssize_t nfds;
    int fds[];
} job_t;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    job_t *queue_head, *queue_tail; /* waiting jobs, oldest first */
    job_t *done_head, *done_tail;   /* finished jobs, oldest first */
    int threads, idle, max_threads;
    int closing;
    int efd;
    int refs; /* the Python object plus one per thread: the last one frees this state */
} state_t;

typedef struct {
    PyObject_HEAD
    state_t *st;
} SyncerObject;

static void push(job_t **head, job_t **tail, job_t *j) /* append to a list, with st->lock held */
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void state_release(state_t *st) /* called with st->lock held; unlocks it */
{
    int last = --st->refs == 0;
    pthread_mutex_unlock(&st->lock);
    if (last) {
        job_t *j;
        while ((j = st->done_head) != NULL) {
            st->done_head = j->next;
            free(j);
        }
        pthread_mutex_destroy(&st->lock);
        pthread_cond_destroy(&st->wake);
        free(st);
    }
}

static void *worker(void *arg)
{
    state_t *st = arg;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (st->queue_head == NULL && !st->closing) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += IDLE_EXIT_S;
            st->idle++;
            int rc = pthread_cond_timedwait(&st->wake, &st->lock, &until);
            st->idle--;
            if (rc == ETIMEDOUT && st->queue_head == NULL)
                goto out;
        }
        job_t *j = st->queue_head;
        if (j == NULL) /* closing and nothing left */
            goto out;
        st->queue_head = j->next;
        if (st->queue_head == NULL)
            st->queue_tail = NULL;
        pthread_mutex_unlock(&st->lock);

        int err = 0;
        for (Py_ssize_t i = 0; i < j->nfds; i++) {
            if (err == 0 && fdatasync(j->fds[i]) != 0)
                err = errno;
            close(j->fds[i]);
        }
        if (j->dir_fd >= 0) {
            if (err == 0 && fsync(j->dir_fd) != 0)
                err = errno;
            close(j->dir_fd);
        }
        j->err = err;

        pthread_mutex_lock(&st->lock);
        push(&st->done_head, &st->done_tail, j);
        if (st->efd >= 0) {
            uint64_t one = 1;
            ssize_t w = write(st->efd, &one, sizeof one);
            (void)w; /* EAGAIN only if the counter would overflow: the loop is reading it anyway */
        }
    }
out:
    st->threads--;
    state_release(st);
    return NULL;
}

static int Syncer_init(SyncerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_threads", NULL};
    int max_threads = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i", kwlist, &max_threads))
        return -1;
    if (max_threads < 1) {
        PyErr_SetString(PyExc_ValueError, "max_threads must be at least 1");
        return -1;
    }
    if (self->st != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer already initialised");
        return -1;
    }
    state_t *st = calloc(1, sizeof *st);
    if (st == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    st->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st->efd < 0) {
        free(st);
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->wake, NULL);
    st->max_threads = max_threads;
    st->refs = 1;
    self->st = st;
    return 0;
}

static PyObject *Syncer_fileno(SyncerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->st == NULL || self->st->efd < 0) {
        PyErr_SetString(PyExc_ValueError, "Syncer is closed");
        return NULL;
    }
    return PyLong_FromLong(self->st->efd);
}

static PyObject *Syncer_submit(SyncerObject *self, PyObject *args)
{
    long long token;
    PyObject *fds;
    int dir_fd;
    if (!PyArg_ParseTuple(args, "LO!i", &token, &PyTuple_Type, &fds, &dir_fd))
        return NULL;
    state_t *st = self->st;
    if (st == NULL || st->closing) {
        PyErr_SetString(PyExc_ValueError, "Syncer is closed");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(fds);
    job_t *j = malloc(sizeof *j + (size_t)n * sizeof(int));
    if (j == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) {
            free(j);
            return NULL;
        }
        if (fd < 0 || fd > INT32_MAX) {
            free(j);
            PyErr_SetString(PyExc_ValueError, "descriptors must be non-negative ints");
            return NULL;
        }
        j->fds[i] = (int)fd;
    }
    j->token = token;
    j->dir_fd = dir_fd;
    j->err = 0;
    j->nfds = n;

    pthread_mutex_lock(&st->lock);
    push(&st->queue_head, &st->queue_tail, j);
    int start = st->idle == 0 && st->threads < st->max_threads;
    if (start) {
        st->threads++;
        st->refs++;
    }
    pthread_cond_signal(&st->wake);
    pthread_mutex_unlock(&st->lock);
    if (start) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        int rc = pthread_create(&t, &attr, worker, st);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            pthread_mutex_lock(&st->lock);
            st->threads--;
            int none_left = st->threads == 0;
            if (none_left) { /* nobody will run the job: take it back, the caller still owns the fds */
                job_t **p = &st->queue_head, *prev = NULL;
                while (*p && *p != j) {
                    prev = *p;
                    p = &(*p)->next;
                }
                if (*p == j) {
                    *p = j->next;
                    if (st->queue_tail == j)
                        st->queue_tail = prev;
                }
            }
            state_release(st); /* the thread's reference; unlocks */
            if (none_left) {
                free(j);
                errno = rc;
                return PyErr_SetFromErrno(PyExc_OSError);
            }
        }
    }
    Py_RETURN_NONE;
}

static PyObject *Syncer_completed(SyncerObject *self, PyObject *Py_UNUSED(ignored))
{
    state_t *st = self->st;
    if (st == NULL)
        return PyList_New(0);
    if (st->efd >= 0) {
        uint64_t count;
        ssize_t r = read(st->efd, &count, sizeof count); /* resets the counter; EAGAIN: nothing new */
        (void)r;
    }
    pthread_mutex_lock(&st->lock);
    job_t *head = st->done_head;
    st->done_head = st->done_tail = NULL;
    pthread_mutex_unlock(&st->lock);

    PyObject *out = PyList_New(0);
    job_t *j;
    while ((j = head) != NULL) {
        head = j->next;
        if (out != NULL) {
            PyObject *item = Py_BuildValue("(Li)", j->token, j->err);
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_CLEAR(out);
            } else {
                Py_DECREF(item);
            }
        }
        free(j);
    }
    return out;
}

static void syncer_close(state_t *st)
{
    pthread_mutex_lock(&st->lock);
    if (!st->closing) {
        st->closing = 1;
        pthread_cond_broadcast(&st->wake);
        if (st->efd >= 0) {
            close(st->efd);
            st->efd = -1;
        }
    }
    pthread_mutex_unlock(&st->lock);
}

static PyObject *Syncer_close(SyncerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->st != NULL)
        syncer_close(self->st);
    Py_RETURN_NONE;
}

static void Syncer_dealloc(SyncerObject *self)
{
    state_t *st = self->st;
    if (st != NULL) {
        syncer_close(st);
        pthread_mutex_lock(&st->lock);
        state_release(st); /* threads still syncing keep the state until they are done */
        self->st = NULL;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Syncer_methods[] = {
    {"fileno", (PyCFunction)Syncer_fileno, METH_NOARGS, "The eventfd to watch for finished jobs."},
    {"submit", (PyCFunction)Syncer_submit, METH_VARARGS,
     "submit(token, fds, dir_fd): fdatasync and close fds (and fsync and close dir_fd unless -1)."},
    {"completed", (PyCFunction)Syncer_completed, METH_NOARGS, "Finished jobs as [(token, errno)]."},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS, "Stop idle threads and close the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pykbroker._native.syncer.Syncer",
    .tp_basicsize = sizeof(SyncerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fdatasync in native threads, completions on an eventfd.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pykbroker._native.syncer", "fdatasync in native threads.", -1, NULL,
};

PyMODINIT_FUNC PyInit_syncer(void)
{
    if (PyType_Ready(&SyncerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SyncerType);
    if (PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0) {
        Py_DECREF(&SyncerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

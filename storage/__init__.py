"""Where the corpus and the models' files live, installed as `edje.storage`: token tables mapped from a node-wide
cache, the FAISS index over their embeddings, shard ownership and models fetched from a folder or the Hub. No torch
modules (the index only takes a torch device to place itself); `edje.model` sits over it.

table_cache      token tables as row-aligned `.npy` files, built once per node under a lock, shared through the page
                 cache (MappedTables; remote tables read into RAM)
token_store      compressed token blobs gathered by image id, refused when they do not match the checkpoint (TokenStore)
embedding_index  the one FAISS index class: any index_factory string, an IVF-PQ index memory-mapped per node (EmbeddingIndex)
prebuild         `python -m edje.storage.prebuild`: the table cache and the first stage's index built ahead of serving
shards           which shard owns an image id (a stable hash), and a table's rows of one shard
hub              models named by a folder or a Hugging Face Hub id, fetched as the environment allows; the one
                 missing-model message (CheckpointNotFound)
"""

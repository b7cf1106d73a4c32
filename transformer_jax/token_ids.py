"""The special token ids that batches, masks, losses, the model and the searches share.

    PAD_ID = 0     padding: masks hide it, losses weigh it 0, searches write it after EOS
    EOS_ID = 1     end of sentence: the tokenizer appends it, a search stops at it
    BOS_ID = 2     reserved by the tokenizer; the decoder does not start from it
    UNK_ID = 3     unknown; never emitted for text (the tokenizer falls back to bytes)

    DECODER_START_ID = PAD_ID   the first input of the decoder, whose input is the
                                output shifted right (§3.1), as in tensor2tensor
"""

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
DECODER_START_ID = PAD_ID
